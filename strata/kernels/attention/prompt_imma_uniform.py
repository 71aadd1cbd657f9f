"""imma g1's P.V over one V bound for the launch (`u1`) and its options (`a1`, `o1`, `v1`).

`u1` (with p16): p normalized by one bound for the launch, the pool's largest V scale (`vbound`, from the host side,
no sync), instead of each chunk's largest: no cross-warp max of the chunk's V scales, no rescale of the accumulator
by the ratio of two chunks' bounds (about five barriers a chunk fewer on sm_90). p = e * vs * 2^14 / vbound <= 2^14
as before; its lo part stays a normal fp16 (p kept to about 22 bits) where e * vs >= vbound * 2^-17, so a cell whose
V scale is far below the pool's largest loses bits only in terms that weigh under 2^-17 of the largest: within the
parity bounds, not g1's bytes. `a1` (with u1): the next chunk's K and V scales loaded during this chunk and carried
by the loop (`scales_at`), so no chunk waits on their global loads; u1's bytes. `o1` (with u1): the V codes read as
16-bit words and split into even and odd dims (`v_pairs`): ldmatrix instead of a shared-memory byte load per code,
the accumulators [NG, M, 32] each, interleaved at the end; u1's bytes under the interpreter (compiled for the
H200 the dots sum in another order: within 1e-5 of the output scale). `v1` (with u1): p made in the scores' layout
(`p_score_side`), each group's V scales a column as the K scales are, one layout change a chunk; u1's bytes interpreted (the H200: as o1).
The kernel is prompt_imma_cells.py's; these are its u1 steps.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from strata.kernels.attention.prompt_blocks import cell_rows
from strata.kernels.attention.prompt_v1 import split_hilo, v_codes


def v_bound(v_scale: torch.Tensor) -> torch.Tensor:
    """`u1`'s bound: the pool's largest V scale as a one-element fp16 tensor on the device (no host sync; one launch),
    0 for an all-zero pool, which the kernel reads as 1. An fp16 scale's maximum is itself an fp16 value: exact."""
    return v_scale.amax().reshape(1)


@triton.jit
def scales_at(cells_row, page_table_ptr, ks_ptr, vs_ptr, c0, count, kvh, n_kv_heads, NG: tl.constexpr,
               CH: tl.constexpr, TRANSLATED: tl.constexpr):
    """`a1`: the K scales of each group ([CH] fp16 each; groups past NG repeat group 0) and the V scales [NG, CH]
    (fp16) of merged cells `c0 .. c0 + CH`: loaded a chunk ahead and carried by the loop, so no chunk waits on its
    scales' global loads (Triton's pipeliner copies ahead only the loads that feed a dot)."""
    rows, valid = cell_rows(cells_row, page_table_ptr, c0, count, kvh, n_kv_heads, CH, TRANSLATED)
    k0, k1, k2, k3 = group_columns(ks_ptr, rows, valid, NG)
    vs = tl.load(vs_ptr + rows[None, :] * NG + tl.arange(0, NG)[:, None], mask=valid[None, :], other=0.0)
    return k0, k1, k2, k3, vs


@triton.jit
def group_columns(s_ptr, rows, valid, NG: tl.constexpr):
    """Each 64-dim group's fp16 scale of the chunk's cells ([CH] each, `s_ptr + row * NG + g`); groups past NG
    repeat group 0 (unused)."""
    c0 = tl.load(s_ptr + rows * NG, mask=valid, other=0.0)
    c1 = c0
    c2 = c0
    c3 = c0
    if NG > 1:
        c1 = tl.load(s_ptr + rows * NG + 1, mask=valid, other=0.0)
    if NG > 2:
        c2 = tl.load(s_ptr + rows * NG + 2, mask=valid, other=0.0)
        c3 = tl.load(s_ptr + rows * NG + 3, mask=valid, other=0.0)
    return c0, c1, c2, c3


@triton.jit
def columns_at(cells_row, page_table_ptr, ks_ptr, vs_ptr, c0, count, kvh, n_kv_heads, NG: tl.constexpr,
                CH: tl.constexpr, TRANSLATED: tl.constexpr):
    """`a1` with `v1`: `scales_at`'s K scales, and the V scales as columns too ([CH] fp16 a group, as `p_score_side`
    takes them; groups past NG repeat group 0)."""
    rows, valid = cell_rows(cells_row, page_table_ptr, c0, count, kvh, n_kv_heads, CH, TRANSLATED)
    k0 = tl.load(ks_ptr + rows * NG, mask=valid, other=0.0)
    v0 = tl.load(vs_ptr + rows * NG, mask=valid, other=0.0)
    k1 = k0
    k2 = k0
    k3 = k0
    v1 = v0
    v2 = v0
    v3 = v0
    if NG > 1:
        k1 = tl.load(ks_ptr + rows * NG + 1, mask=valid, other=0.0)
        v1 = tl.load(vs_ptr + rows * NG + 1, mask=valid, other=0.0)
    if NG > 2:
        k2 = tl.load(ks_ptr + rows * NG + 2, mask=valid, other=0.0)
        k3 = tl.load(ks_ptr + rows * NG + 3, mask=valid, other=0.0)
        v2 = tl.load(vs_ptr + rows * NG + 2, mask=valid, other=0.0)
        v3 = tl.load(vs_ptr + rows * NG + 3, mask=valid, other=0.0)
    return k0, k1, k2, k3, v0, v1, v2, v3


@triton.jit
def v_pairs(v_ptr, rows, valid, NG: tl.constexpr):
    """`o1`: V codes of each 64-dim group read as 32 16-bit words [NG, CH, 32] (a 16-bit operand, which reaches the
    dot through ldmatrix.trans, not a byte load per code), split into the even and the odd dims as fp16 (exact)."""
    g = tl.arange(0, NG)[:, None, None]
    w = tl.load(v_ptr.to(tl.pointer_type(tl.int16)) + rows[None, :, None] * (NG * 32) + g * 32
                + tl.arange(0, 32)[None, None, :], mask=valid[None, :, None], other=0)
    u = w.to(tl.uint16, bitcast=True)
    # a byte b of code c (b = c mod 256) as the fp16 of bits 0x6400 | (b ^ 0x80): 1024 + c + 128, exact; minus 1152.
    # Little-endian: the low byte is dim 2j, the high byte dim 2j + 1. Bitwise ops only (two codes a 32-bit word)
    even = ((u & 0xFF) ^ 0x6480).to(tl.float16, bitcast=True) - 1152.0
    odd = ((u >> 8) ^ 0x6480).to(tl.float16, bitcast=True) - 1152.0
    return even, odd


@triton.jit
def p_score_side(e, vs_ptr, rows, valid, up, NG: tl.constexpr, columns=None, GIVEN: tl.constexpr = False):
    """`v1`: u1's p [NG, M, CH] made in the scores' layout, where each group's V scales [CH] load as the K scales do
    (one column each), then moved into P.V's layout as one tensor: one layout change a chunk where e and the V scales
    took one each (with their barriers). The same products as `pv_uniform`'s: u1's bytes. GIVEN (`a1`): the columns
    are `columns` (four, `columns_at`'s), loaded a chunk ahead."""
    if GIVEN:
        c0, c1, c2, c3 = columns
    else:
        c0, c1, c2, c3 = group_columns(vs_ptr, rows, valid, NG)
    p0 = e * (c0.to(tl.float32) * up)[None, :]
    if NG == 1:
        p = p0[None, :, :]
    else:
        p1 = e * (c1.to(tl.float32) * up)[None, :]
        if NG == 2:
            p = tl.permute(tl.join(p0, p1), (2, 0, 1))
        else:
            p2 = e * (c2.to(tl.float32) * up)[None, :]
            p3 = e * (c3.to(tl.float32) * up)[None, :]
            # [M, CH, 2, 2] whose [i, j] is group 2i + j, then groups first
            p = tl.join(tl.join(p0, p2), tl.join(p1, p3))
            p = tl.permute(tl.reshape(p, (p0.shape[0], p0.shape[1], 4)), (2, 0, 1))
    return p


@triton.jit
def pv_dots(hi, lo, v_ptr, rows, valid, acc_a, acc_b, f, NG: tl.constexpr, EXACT: tl.constexpr,
            HALVES: tl.constexpr):
    """`acc * f + (hi + lo) . V` of the chunk's V codes: one dot pair over 64 dims into acc_a, or (HALVES) over dims
    0-31 into acc_a and 32-63 into acc_b."""
    if HALVES:
        v = v_codes(v_ptr, rows, valid, 0, 32, NG, EXACT)
        acc_a = acc_a * f + tl.dot(lo, v, tl.dot(hi, v))
        v = v_codes(v_ptr, rows, valid, 32, 32, NG, EXACT)
        acc_b = acc_b * f + tl.dot(lo, v, tl.dot(hi, v))
    else:
        v = v_codes(v_ptr, rows, valid, 0, 64, NG, EXACT)
        acc_a = acc_a * f + tl.dot(lo, v, tl.dot(hi, v))
    return acc_a, acc_b


@triton.jit
def pv_uniform(e, v_ptr, vs_ptr, rows, valid, acc_a, acc_b, alpha, up, NG: tl.constexpr, EXACT: tl.constexpr,
                HALVES: tl.constexpr, vs_given=0.0, GIVEN: tl.constexpr = False, PAIRS: tl.constexpr = False,
                SIDE: tl.constexpr = False, up_one=1.0):
    """pv_hilo's P.V with p = e * vs * up (`up = 2^14 / vbound`, the same for every chunk: `u1`), into accumulators
    in units of 1 / up: `acc = acc * alpha + dot`, no per-group bound to find or rescale by. GIVEN (`a1`): the V
    scales are `vs_given` [NG, CH] (with SIDE: four columns), loaded a chunk ahead. PAIRS (`o1`): acc_a holds the
    even dims of each group and acc_b the odd ones [NG, M, 32] (`v_pairs`), interleaved once at the end. SIDE (`v1`):
    p from `p_score_side` (`up_one`: up as a scalar)."""
    if SIDE:
        p = p_score_side(e, vs_ptr, rows, valid, up_one, NG, vs_given, GIVEN)
    elif GIVEN:
        vs = vs_given.to(tl.float32)
    else:
        g = tl.arange(0, NG)
        vs = tl.load(vs_ptr + rows[None, :] * NG + g[:, None], mask=valid[None, :], other=0.0).to(tl.float32)
    if not SIDE:
        p = e[None, :, :] * (vs * up[:, None])[:, None, :]  # [NG, M, CH], <= 2^14
    hi, lo = split_hilo(p)
    f = alpha[None, :, None]
    if PAIRS:
        v_even, v_odd = v_pairs(v_ptr, rows, valid, NG)
        acc_a = acc_a * f + tl.dot(lo, v_even, tl.dot(hi, v_even))
        acc_b = acc_b * f + tl.dot(lo, v_odd, tl.dot(hi, v_odd))
    else:
        acc_a, acc_b = pv_dots(hi, lo, v_ptr, rows, valid, acc_a, acc_b, f, NG, EXACT, HALVES)
    return acc_a, acc_b
