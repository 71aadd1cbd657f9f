"""Prompt attention v1: fp16 tensor-core dots on the int8 codes, q and p split into fp16 hi + lo (about 22 bits).

The math (shared with v2, which imports it from here):
- q: `qm = max|q|` over the program's heads and dims (v2: over each head's dims), `qm < 2^qe`; `x = q * 2^(14 - qe)`,
  `hi = fp16(x)`, `lo = fp16(x - hi)`. The 2^14 bound keeps lo out of the subnormals. Codes enter the dots exactly as
  fp16.
- scores, per 64-dim group g: `t_g = hi . K_g + lo . K_g` (fp32 sums), `s = sum_g t_g * k_scale_g * 2^(qe - 14)`,
  times `scale_log2`.
- P.V, per group g: `vmax = max_c v_scale[c, g]`, `p' = e * v_scale * 16384 / vmax` (<= 2^14) split into hi + lo,
  `acc_g = acc_g * alpha + (hi . V_g + lo . V_g) * vmax / 16384`.
v1's organization: one chunk gathered, then computed (no pipelining); scores accumulated group after group with the
group's slice of q re-split each time (the Turing kernel's order). Reads int8 pools, and fp16 pools (scales 1).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from strata.kernels.attention.paged import PagedKV
from strata.kernels.attention.prompt_parts import chunk_rows, launch_prompt_kernel, softmax_step


@triton.jit
def q_exponent(qm):
    """(2^(14 - qe), 2^(qe - 14)) with `qm = max|q| < 2^qe` (qe clamped to [-112, 127], 0 for q = 0)."""
    bits = qm.to(tl.int32, bitcast=True)
    qe = tl.where(qm > 0, ((bits >> 23) & 255) - 126, 0)
    qe = tl.minimum(tl.maximum(qe, -112), 127)
    up = ((141 - qe) << 23).to(tl.float32, bitcast=True)
    down = ((qe + 113) << 23).to(tl.float32, bitcast=True)
    return up, down


@triton.jit
def split_hilo(x):
    """fp16 hi and lo parts of fp32 `x` (|x| <= 2^14): hi + lo carries about 22 bits of x."""
    hi = x.to(tl.float16)
    return hi, (x - hi.to(tl.float32)).to(tl.float16)


@triton.jit
def codes_to_half(x, EXACT: tl.constexpr = 0):
    """int8 codes as fp16, exactly. EXACT 1: through the bits (`0x6480 + c` read as fp16 is 1152 + c), an int16 add and
    a half subtract instead of the int-to-float conversion, which runs at a quarter of the rate."""
    if EXACT != 0:
        return (x.to(tl.int16) + 0x6480).to(tl.float16, bitcast=True) - 1152.0
    return x.to(tl.float16)


@triton.jit
def pv_hilo(e, v_ptr, vs_ptr, rows, valid, NG: tl.constexpr, CH: tl.constexpr, INT8: tl.constexpr,
            EXACT: tl.constexpr = 0):
    """The chunk's e . V per 64-dim group [NG, M, 64] (fp32), p split hi + lo against each group's largest scale."""
    g = tl.arange(0, NG)
    dv = tl.arange(0, 64)
    v = tl.load(v_ptr + rows[None, :, None] * (NG * 64) + g[:, None, None] * 64 + dv[None, None, :],
                mask=valid[None, :, None], other=0)  # [NG, CH, 64]
    if EXACT == 2:  # times the cells' 0/1 mask (exact: masked codes are 0): Triton then keeps the conversion before
        # the dot operand's shared-memory load, so fp16 V reaches the dot by ldmatrix.trans, not a byte load per code
        v = codes_to_half(v, EXACT) * tl.where(valid, 1.0, 0.0).to(tl.float16)[None, :, None]
    else:
        v = codes_to_half(v, EXACT)
    if INT8:
        vs = tl.load(vs_ptr + rows[None, :] * NG + g[:, None], mask=valid[None, :], other=0.0).to(tl.float32)
    else:
        vs = tl.where(valid[None, :], 1.0, 0.0) + tl.zeros((NG, CH), tl.float32)
    vmax = tl.max(vs, axis=1)
    vmax = tl.where(vmax > 0, vmax, 1.0)
    p = e[None, :, :] * (vs * (16384.0 / vmax)[:, None])[:, None, :]  # [NG, M, CH], <= 2^14
    hi, lo = split_hilo(p)
    return tl.dot(lo, v, tl.dot(hi, v)) * (vmax * (1.0 / 16384.0))[:, None, None]


@triton.jit
def v_codes(v_ptr, rows, valid, d0, W: tl.constexpr, NG: tl.constexpr, EXACT: tl.constexpr):
    """V codes of dims `d0 .. d0 + W` of each 64-dim group [NG, CH, W], as fp16 (exact; x2 as in pv_hilo)."""
    g = tl.arange(0, NG)[:, None, None]
    v = tl.load(v_ptr + rows[None, :, None] * (NG * 64) + g * 64 + d0 + tl.arange(0, W)[None, None, :],
                mask=valid[None, :, None], other=0)
    if EXACT == 2:
        return codes_to_half(v, EXACT) * tl.where(valid, 1.0, 0.0).to(tl.float16)[None, :, None]
    return codes_to_half(v, EXACT)


@triton.jit
def pv_hilo_halves(e, v_ptr, vs_ptr, rows, valid, acc_a, acc_b, alpha, NG: tl.constexpr, EXACT: tl.constexpr):
    """pv_hilo added into the accumulators of dims 0-31 (acc_a) and 32-63 (acc_b) of each group [NG, M, 32] as two
    dots over 32 dims (`d2`): the same p, hi, lo, products and sums, half the dot result live at a time (fewer
    registers: 194 -> 128 without spills for v2 on sm_90)."""
    g = tl.arange(0, NG)
    vs = tl.load(vs_ptr + rows[None, :] * NG + g[:, None], mask=valid[None, :], other=0.0).to(tl.float32)
    vmax = tl.max(vs, axis=1)
    vmax = tl.where(vmax > 0, vmax, 1.0)
    hi, lo = split_hilo(e[None, :, :] * (vs * (16384.0 / vmax)[:, None])[:, None, :])  # [NG, M, CH], <= 2^14
    down = (vmax * (1.0 / 16384.0))[:, None, None]
    v = v_codes(v_ptr, rows, valid, 0, 32, NG, EXACT)
    acc_a = acc_a * alpha[None, :, None] + tl.dot(lo, v, tl.dot(hi, v)) * down
    v = v_codes(v_ptr, rows, valid, 32, 32, NG, EXACT)
    acc_b = acc_b * alpha[None, :, None] + tl.dot(lo, v, tl.dot(hi, v)) * down
    return acc_a, acc_b


@triton.jit
def join_halves(acc_a, acc_b, NG: tl.constexpr, M: tl.constexpr):
    """[NG, M, 64] from the accumulators of dims 0-31 and 32-63 of each group."""
    return tl.reshape(tl.permute(tl.join(acc_a, acc_b), (0, 1, 3, 2)), (NG, M, 64))


@triton.jit
def _prompt_v1_kernel(q_ptr, out_ptr, ids_ptr, width_ptr, page_table_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr,
                      cap, n_kv_heads, scale_log2,
                      G: tl.constexpr, BM: tl.constexpr, NG: tl.constexpr, CH: tl.constexpr, INT8: tl.constexpr):
    D: tl.constexpr = NG * 64
    qi = tl.program_id(0)
    kvh = tl.program_id(1)
    r = tl.arange(0, BM)
    d = tl.arange(0, D)
    d64 = tl.arange(0, 64)
    head = (qi.to(tl.int64) * n_kv_heads + kvh) * G + r
    q = tl.load(q_ptr + head[:, None] * D + d[None, :], mask=r[:, None] < G, other=0.0)
    up, down = q_exponent(tl.max(tl.max(tl.abs(q), axis=1), axis=0))
    qdown = scale_log2 * down
    width = tl.load(width_ptr + qi)
    ids_row = ids_ptr + qi.to(tl.int64) * cap
    m = tl.full((BM,), float("-inf"), tl.float32)
    l = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((NG, BM, 64), tl.float32)
    for c0 in range(0, width, CH):
        rows, valid = chunk_rows(ids_row, page_table_ptr, c0, width, kvh, n_kv_heads, CH)
        sc = tl.zeros((BM, CH), tl.float32)
        for g in tl.static_range(NG):
            hi, lo = split_hilo(tl.load(q_ptr + head[:, None] * D + g * 64 + d64[None, :], mask=r[:, None] < G,
                                        other=0.0) * up)
            k = tl.load(k_ptr + rows[None, :] * D + g * 64 + d64[:, None], mask=valid[None, :], other=0)
            t = tl.dot(lo, k.to(tl.float16), tl.dot(hi, k.to(tl.float16)))
            if INT8:
                t = t * tl.load(ks_ptr + rows * NG + g, mask=valid, other=0.0).to(tl.float32)[None, :]
            sc += t
        e, alpha, m, l = softmax_step(sc * qdown, valid, m, l)
        acc = acc * alpha[None, :, None] + pv_hilo(e, v_ptr, vs_ptr, rows, valid, NG, CH, INT8)
    out = tl.where(l[None, :, None] > 0, acc / l[None, :, None], 0.0)
    g3 = tl.arange(0, NG)[:, None, None]
    tl.store(out_ptr + head[None, :, None] * D + g3 * 64 + d64[None, None, :], out, mask=r[None, :, None] < G)


def prompt_attn_v1(q: torch.Tensor, pool: PagedKV, page_table: torch.Tensor, ids: torch.Tensor,
                   width: torch.Tensor, sm_scale: float | None = None) -> torch.Tensor:
    """Prompt attention v1 (int8 or fp16 pool): [n_q, H, D] fp32."""
    return launch_prompt_kernel(_prompt_v1_kernel, q, pool, page_table, ids, width, sm_scale,
                                NG=q.shape[-1] // 64, INT8=pool.int8, num_warps=4, num_stages=1)
    return out
