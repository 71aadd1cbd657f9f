"""Prompt attention IMMA (`STRATA_PROMPT_ATTN_IMMA=1`): both products as int8 x int8 dots on the stored codes.

The other operand is split exactly into three signed bytes (24 bits). For `|y| <= 127` and `X = round(y * 65536)`:
`m = ((X + 128) & 255) - 128`, `X1 = (X - m) >> 8`, `l = ((X1 + 128) & 255) - 128`, `h = (X1 - l) >> 8`, so
`X = 65536 h + 256 l + m` with h, l, m in [-128, 127] (h in [-127, 127]); Triton's int8 dot wants signed bytes on both
sides. Each part's int32 sum is exact; `join3 = float(sum h b) + float(256 sum l b + sum m b) / 65536`.
- q . k: q scaled per (head, 64-dim group) to 127: `part_g = join3 * (mx / 127) * k_scale_g`; `s = sum_g part_g`,
  times `scale_log2`.
- P . V: `a = e * v_scale_g` scaled per (row, group) over the chunk's 32 cells to 127 (a per-group scale alone loses
  accuracy); `acc_g = acc_g * alpha + join3 * mx / 127`.
v2's blocks (prompt_blocks.py: queries x heads as rows, each chunk of their shared cells loaded once), pipeline and
softmax; int8 pools, sm_80+. Config `p16`: P.V as v2's fp16 hi + lo dots instead (q . k stays int8), to measure what
the int8 P.V costs: its B operand (V codes, dims contiguous) is not K-contiguous, which int8 MMAs want. `d2` (with
p16): that P.V in two halves of the dims; `g1` (and `n2`, `u1`): the scores per 64-dim group, prompt_imma_cells.py;
with g1, `i1`/`i2`: prefix blocks (prompt_prefix.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from strata.errors import StrataError
from strata.kernels.attention.paged import PagedKV
from strata.kernels.attention.prompt_blocks import (PromptConfig, block_chunk, block_rows, block_store,
                                                     cell_attend, cell_rows, launch_blocked, split_range)
from strata.kernels.attention.prompt_parts import softmax_step_masked
from strata.kernels.attention.prompt_v1 import join_halves, pv_hilo, pv_hilo_halves

# the H200 sweep's fastest (session 4): one query and its KV group per program; blocks of queries ran up to 2x slower
# H200 sweep (session 5): ids translated first, P.V in fp16 hi + lo, 128 registers a thread: 1.28x, within bounds
# Session 6's sweep: `t2p16r128x1g1` (rows by int32 offsets, codes to fp16 by their bits, one 2D dot per 64-dim
# group) 1.146 ms at 32K x 1024, 1.69x the previous default over the five shapes, within the bounds
# Session 7's sweep (branch imma2): `s2...u1a1o1` (p scaled by the pool's largest V scale, the next chunk's scales
# loaded ahead, V read as 16-bit words; 2 stages, no spills) 1.21x the previous default over the five shapes
# (1.10-1.31x), errors vs FP64 7e-7 against 1.2-1.6e-6, within the bounds (not the previous bytes)
# Session 8 (branch imma3): prefix blocks of 4 queries x 4 heads (`q4h4...i2z1y4`: consecutive queries whose
# selections are prefixes of their block's last share its chunks, the others one a program beside them on a second
# stream, the widest blocks first, splits below 4 programs an SM). H200, kernels timed by CUDA graph replay: 1.26x at
# 1.5K x 1500 (0.385 against 0.485 ms), 0.91x at 2.1K x 256 (0.226 against 0.206), 0.97-0.99x at the three long
# shapes, and eager its second stream and splits cost 2.1x at 2.1K x 256 (0.516 against 0.245 ms). So the default
# stays session 7's, which graph replay puts at 1.51-1.62x the floor at all five shapes (eager 1.58-1.90x); the
# prefix blocks are opt-in (STRATA_PA_CONFIG=q4h4c32w4s2t2p16r128x1g1u1a1o1i1z1y4: the best at identity selections).
DEFAULT = PromptConfig(queries=1, heads=0, chunk=32, warps=4, stages=2, translate=2, pv=16, maxreg=128, exact=1,
                       scores=1, uniform=1, ahead=1, pairs=1)

SPLIT_LIMIT = 127 * 65536


def split3_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Torch mirror of `split3` on integers X (int32/int64 tensor, |X| <= 127 * 65536): (h, l, m) as int8."""
    x = x.long()
    m = ((x + 128) & 255) - 128
    x1 = (x - m) >> 8
    low = ((x1 + 128) & 255) - 128
    return ((x1 - low) >> 8).to(torch.int8), low.to(torch.int8), m.to(torch.int8)


@triton.jit
def split3(y):
    """Three signed-byte parts of `round(y * 65536)` for |y| <= 127 (clamped there)."""
    x = tl.floor(y * 65536.0 + 0.5).to(tl.int32)
    x = tl.minimum(tl.maximum(x, -8323072), 8323072)
    m = x.to(tl.int8)  # int32 -> int8 keeps the low byte, read signed: ((x + 128) & 255) - 128 in one step
    x1 = (x - m.to(tl.int32)) >> 8
    low = x1.to(tl.int8)
    return ((x1 - low.to(tl.int32)) >> 8).to(tl.int8), low, m


@triton.jit
def dot3(h, low, m, b):
    """`round(y * 65536) . b / 65536` from y's parts and int8 `b`: three exact int32 dots joined in fp32."""
    hb = tl.dot(h, b).to(tl.float32)
    rest = (tl.dot(low, b) * 256 + tl.dot(m, b)).to(tl.float32)
    return hb + rest * (1.0 / 65536.0)


@triton.jit
def _prompt_imma_kernel(q_ptr, out_ptr, parts_ptr, ml_ptr, cells_ptr, members_ptr, count_ptr, page_table_ptr, k_ptr,
                        v_ptr, ks_ptr, vs_ptr, block0, n_q, row_len, n_kv_heads, scale_log2,
                        G: tl.constexpr, HP: tl.constexpr, BQ: tl.constexpr, BM: tl.constexpr, CH: tl.constexpr,
                        TRANSLATED: tl.constexpr, SPLITS: tl.constexpr, PREFETCH: tl.constexpr, NG: tl.constexpr,
                        PV: tl.constexpr = 8, EXACT: tl.constexpr = 0, HALVES: tl.constexpr = False,
                        REVERSE: tl.constexpr = False):
    D: tl.constexpr = NG * 64
    blk, kvh, slot, head, ok = block_rows(block0, n_q, n_kv_heads, G, HP, BQ, BM, REVERSE)
    gi = tl.arange(0, NG)
    g = gi[:, None, None]
    d = tl.arange(0, 64)[None, None, :]
    hd = head[None, :, None]
    q = tl.load(q_ptr + hd * D + g * 64 + d, mask=ok[None, :, None], other=0.0)  # [NG, BM, 64]
    qmax = tl.max(tl.abs(q), axis=2)  # [NG, BM]
    qh, ql, qm = split3(q * tl.where(qmax > 0, tl.math.div_rn(tl.zeros_like(qmax) + 127.0, qmax), 0.0)[:, :, None])
    qdown = qmax * (scale_log2 / 127.0)
    count = tl.load(count_ptr + blk)
    cells_row = cells_ptr + blk.to(tl.int64) * row_len
    members_row = members_ptr + blk.to(tl.int64) * row_len
    m = tl.full((BM,), float("-inf"), tl.float32)
    l = tl.zeros((BM,), tl.float32)
    if HALVES:  # p16 only: dims 0-31 and 32-63 of each group (pv_hilo_halves)
        acc_a = tl.zeros((NG, BM, 32), tl.float32)
        acc_b = tl.zeros((NG, BM, 32), tl.float32)
    else:
        acc = tl.zeros((NG, BM, 64), tl.float32)
    dk = tl.arange(0, 64)[None, :, None]
    c_lo, c_hi = split_range(count, CH, SPLITS)
    if PREFETCH:
        rows_next, valid_next = cell_rows(cells_row, page_table_ptr, c_lo, count, kvh, n_kv_heads, CH, TRANSLATED)
    for c0 in range(c_lo, c_hi, CH):
        if PREFETCH:  # this chunk's rows came with the previous step; the next chunk's load now
            rows, valid = rows_next, valid_next
            rows_next, valid_next = cell_rows(cells_row, page_table_ptr, c0 + CH, count, kvh, n_kv_heads, CH,
                                              TRANSLATED)
            attend = cell_attend(members_row, c0, valid, slot, CH, BQ)
        else:
            rows, valid, attend = block_chunk(cells_row, members_row, page_table_ptr, c0, count, kvh, n_kv_heads,
                                              slot, CH, BQ, TRANSLATED)
        k = tl.load(k_ptr + rows[None, None, :] * D + g * 64 + dk, mask=valid[None, None, :], other=0)
        ks = tl.load(ks_ptr + rows[None, :] * NG + gi[:, None], mask=valid[None, :], other=0.0).to(tl.float32)
        part = dot3(qh, ql, qm, k) * qdown[:, :, None] * ks[:, None, :]  # [NG, BM, CH]
        e, alpha, m, l = softmax_step_masked(tl.sum(part, axis=0), attend, m, l)
        if HALVES:
            acc_a, acc_b = pv_hilo_halves(e, v_ptr, vs_ptr, rows, valid, acc_a, acc_b, alpha, NG, EXACT)
        elif PV == 8:
            v = tl.load(v_ptr + rows[None, :, None] * D + g * 64 + d, mask=valid[None, :, None], other=0)
            vs = tl.load(vs_ptr + rows[None, :] * NG + gi[:, None], mask=valid[None, :], other=0.0).to(tl.float32)
            a = e[None, :, :] * vs[:, None, :]  # [NG, BM, CH]
            amax = tl.max(a, axis=2)
            ph, pl, pm = split3(a * tl.where(amax > 0, tl.math.div_rn(tl.zeros_like(amax) + 127.0, amax),
                                             0.0)[:, :, None])
            acc = acc * alpha[None, :, None] + dot3(ph, pl, pm, v) * (amax * (1.0 / 127.0))[:, :, None]
        elif PV == 16:  # V codes are not K-contiguous: int8 dots may need a byte transpose that fp16 ones do not
            acc = acc * alpha[None, :, None] + pv_hilo(e, v_ptr, vs_ptr, rows, valid, NG, CH, True, EXACT)
        else:  # 0: no P.V (a probe timing the rest; prompt_probe.py)
            acc = acc * alpha[None, :, None]
    if HALVES:
        acc = join_halves(acc_a, acc_b, NG, BM)
    block_store(out_ptr, parts_ptr, ml_ptr, acc, m, l, head, ok, NG, SPLITS)


def check_config(config: PromptConfig) -> None:
    """A clear error for imma options that do not go together."""
    if (config.qparts or config.early) and not config.scores or (config.halves or config.early > 1) and config.pv != 16:
        raise StrataError(f"prompt-attention config {config.label}: n2 and e1 go with g1, d2 and e2 with p16")
    uniform_ok = config.scores and config.pv == 16
    if config.uniform and not uniform_ok or (config.ahead or config.pairs or config.vside) and not config.uniform:
        raise StrataError(f"prompt-attention config {config.label}: u1 goes with g1 and p16, a1, o1 and v1 with u1")
    if config.prefix and not config.scores:
        raise StrataError(f"prompt-attention config {config.label}: prefix blocks (i1, i2) go with g1")


def uniform_flags(config: PromptConfig) -> dict:
    """The per-group kernel's constexprs for the u1 options a config sets (the kernel's defaults: off)."""
    flags = {"UNIFORM": config.uniform, "AHEAD": config.ahead, "PAIRS": config.pairs, "SIDE": config.vside}
    return {name: True for name, on in flags.items() if on}


def prompt_attn_imma(q: torch.Tensor, pool: PagedKV, page_table: torch.Tensor, ids: torch.Tensor,
                     width: torch.Tensor, sm_scale: float | None = None,
                     config: PromptConfig | None = None) -> torch.Tensor:
    """Prompt attention on int8 x int8 dots (int8 pool): [n_q, H, D] fp32."""
    config = PromptConfig.chosen(config, DEFAULT)
    check_config(config)
    kernel = _prompt_imma_kernel
    if config.scores:
        from strata.kernels.attention.prompt_imma_cells import GROUP_COUNTS, _prompt_imma_cells_kernel

        if q.shape[-1] // 64 not in GROUP_COUNTS:
            raise StrataError(f"prompt-attention config {config.label}: g1 takes head dims of "
                              f"{', '.join(str(64 * n) for n in GROUP_COUNTS)}, not {q.shape[-1]}")
        kernel = _prompt_imma_cells_kernel
    extra = {"QPARTS": 2} if config.qparts else {}  # the kernels' defaults leave the launch as before
    if config.halves:
        extra["HALVES"] = True
    if config.early:
        extra["EARLY"] = config.early
    if config.scores:  # the per-group kernel's V bound: u1's (the pool's largest V scale), else unused
        from strata.kernels.attention.prompt_imma_uniform import v_bound

        extra["vbound_ptr"] = v_bound(pool.v_scale) if config.uniform else pool.v_scale
        extra.update(uniform_flags(config))
    return launch_blocked(kernel, q, pool, page_table, ids, width, sm_scale, config, NG=q.shape[-1] // 64,
                          PV=config.pv or 8, EXACT=config.exact, **extra)
