"""imma with its scores as one 2D dot per 64-dim group (config `g1`): the warps split the chunk's cells, not the groups.

imma's q . k is a dot batched over the groups [NG, rows, 64] x [NG, 64, cells]; Triton gives each warp one group, so
the sum of the groups' scaled partials `sum_g part_g * k_scale_g` crosses warps: on sm_90 it compiles to about 150
instructions and three barriers a chunk (shared-memory stores, loads and shuffles), and every warp then repeats the
whole softmax. Here each group's partial is a 2D dot [rows, 64] x [64, cells], whose warps take a quarter of the cells
each: the groups are summed in registers in a fixed order (((p0 + p1) + p2) + p3) (deterministic), each warp
exponentiates only its own cells, and the running sum `l` is kept per cell (a [rows, cells] tile summed once at the
end) so only the running max crosses warps. P.V stays imma's (batched over the groups, a warp per group: its scale
groups are the V scale groups); the chunk's e reach it through one layout change.
The same math as imma (q split exactly into three bytes per (head, group), the same P.V forms); other summation
orders, so not imma's bytes: within the parity bounds. q's parts are made per group before the loop (a tensor per
group and part: Triton cannot index a register tensor), so the head dim is 64, 128 or 256. `n2`: q in two parts (16
bits, a third fewer score dots): not exact to 24 bits, the sweep's bounds say whether it passes. With p16 the P.V
is pv_hilo's, its accumulator rescaled in one multiply-add a chunk (`_pv_rescaled`); `d2`: as two dots over 32 dims
each, the same p and products in another order of issue, the same sums, half the dot result live at a time.
`e1`: the K scales reach the scores through a one-hot dot (`_scale_rows`), so Triton's pipeliner copies them ahead
with K instead of the loop waiting on their loads; `e2`: the V scales too. The same values (exact), the same bytes.
`u1` (with p16) and its `a1`, `o1`, `v1`: P.V over one V bound for the launch (prompt_imma_uniform.py).
"""

from __future__ import annotations

import triton
import triton.language as tl

from strata.kernels.attention.prompt_blocks import (block_chunk, block_rows, block_store, cell_attend, cell_rows,
                                                     split_range)
from strata.kernels.attention.prompt_imma import dot3, split3
from strata.kernels.attention.prompt_prefix import block_source, prefix_attend
from strata.kernels.attention.prompt_imma_uniform import columns_at, pv_dots, pv_uniform, scales_at
from strata.kernels.attention.prompt_v1 import join_halves, split_hilo, v_codes

GROUP_COUNTS = (1, 2, 4)  # the numbers of 64-dim groups the kernel unrolls (head dims 64, 128, 256)


@triton.jit
def _q_parts(q_ptr, head, ok, g, D: tl.constexpr, QPARTS: tl.constexpr):
    """Group g of each row's q: its three exact byte parts (scaled to 127) and its way back, `max|q| / 127`. QPARTS 2
    (`n2`): q rounded to 16 bits instead, `round(y * 256) = 256 l + m` (split3 of y / 256: h = 0, unused)."""
    q = tl.load(q_ptr + head[:, None] * D + g * 64 + tl.arange(0, 64)[None, :], mask=ok[:, None], other=0.0)
    qmax = tl.max(tl.abs(q), axis=1)
    y = q * tl.where(qmax > 0, tl.math.div_rn(tl.zeros_like(qmax) + 127.0, qmax), 0.0)[:, None]
    h, low, m = split3(y * (1.0 / 256.0) if QPARTS == 2 else y)
    return h, low, m, qmax * (1.0 / 127.0)


@triton.jit
def _scale_tile(s_ptr, rows, valid, NG: tl.constexpr):
    """[16, CH] fp16: row g < NG holds group g's scale of each cell (fp16 at `s_ptr + row * NG + g`: a cell's groups
    are adjacent, so a column is one 8-byte copy), the other rows 0. Meant for `_scale_rows`: a load that feeds a dot
    is copied ahead by Triton's pipeliner; one that feeds only arithmetic is loaded in the loop, waiting on it."""
    r = tl.arange(0, 16)[:, None]
    return tl.load(s_ptr + rows[None, :] * NG + r, mask=(r < NG) & valid[None, :], other=0.0)


@triton.jit
def _scale_rows(tile, g, BM: tl.constexpr):
    """[BM, CH] fp32: row g of a `_scale_tile` in every row, as a dot of a one-hot column with the tile, in the
    scores' own layout. Exact: each output is one product of 1 and an fp16."""
    one = tl.where(tl.arange(0, 16)[None, :] == g, 1.0, 0.0).to(tl.float16) + tl.zeros((BM, 16), tl.float16)
    return tl.dot(one, tile)


@triton.jit
def _group_part(h, low, m, qdown, k_ptr, ks_ptr, rows, valid, g, NG: tl.constexpr, QPARTS: tl.constexpr, ks_tile,
                TILE: tl.constexpr, BM: tl.constexpr):
    """Group g's scaled partial scores [rows, cells]: the exact int8 dots of q's parts with the K codes, times q's
    and K's scales (TILE, `e1`, `e2`: from `ks_tile`, the chunk's `_scale_tile` of K scales; TILE 2, `a1`: `ks_tile`
    is group g's K scales [CH] themselves)."""
    k = tl.load(k_ptr + rows[None, :] * (NG * 64) + g * 64 + tl.arange(0, 64)[:, None], mask=valid[None, :], other=0)
    if TILE == 2:  # a1: this group's K scales [CH], loaded during the previous chunk
        ks = ks_tile.to(tl.float32)[None, :]
    elif TILE:
        ks = _scale_rows(ks_tile, g, BM)
    else:
        ks = tl.load(ks_ptr + rows * NG + g, mask=valid, other=0.0).to(tl.float32)[None, :]
    if QPARTS == 2:
        t = (tl.dot(low, k) * 256 + tl.dot(m, k)).to(tl.float32) * (1.0 / 256.0)
    else:
        t = dot3(h, low, m, k)
    return t * qdown[:, None] * ks


@triton.jit
def _pv_rescaled(e, v_ptr, vs_ptr, rows, valid, acc_a, acc_b, alpha, down, NG: tl.constexpr, EXACT: tl.constexpr,
                 HALVES: tl.constexpr, EARLY: tl.constexpr = False, BM: tl.constexpr = 16):
    """pv_hilo's P.V (the same p, hi and lo) into accumulators kept in units of the chunk's `down = vmax / 16384`
    per group: `acc = acc * (alpha * down_old / down) + dot` is one fused multiply-add an element where pv_hilo's
    `acc * alpha + dot * down` takes two (the caller multiplies by the last `down` once, at the end). HALVES (`d2`):
    two dots over 32 dims each, into acc_a (dims 0-31 of each group) and acc_b (32-63), half the dot result live at a
    time (about 90 registers a thread less on sm_90); otherwise one dot over 64 dims into acc_a. EARLY (`e2`): the V
    scales as `_scale_rows` gets the K scales (a batched one-hot dot, copied ahead by the pipeliner); the same p."""
    if EARLY:
        b = tl.arange(0, NG)[:, None, None]
        k = tl.arange(0, 16)[None, :, None]
        tile = tl.load(vs_ptr + rows[None, None, :] * NG + k + b * 0, mask=(k < NG) & valid[None, None, :], other=0.0)
        one = tl.where(tl.arange(0, 16)[None, None, :] == b, 1.0, 0.0).to(tl.float16) + tl.zeros((NG, BM, 16),
                                                                                                tl.float16)
        vs = tl.dot(one, tile)  # [NG, M, CH]: group g's V scales in every row
        vmax = tl.max(tl.max(vs, axis=2), axis=1)
        vmax = tl.where(vmax > 0, vmax, 1.0)
        hi, lo = split_hilo(e[None, :, :] * (vs * (16384.0 / vmax)[:, None, None]))  # [NG, M, CH], <= 2^14
    else:
        g = tl.arange(0, NG)
        vs = tl.load(vs_ptr + rows[None, :] * NG + g[:, None], mask=valid[None, :], other=0.0).to(tl.float32)
        vmax = tl.max(vs, axis=1)
        vmax = tl.where(vmax > 0, vmax, 1.0)
        hi, lo = split_hilo(e[None, :, :] * (vs * (16384.0 / vmax)[:, None])[:, None, :])  # [NG, M, CH], <= 2^14
    new_down = vmax * (1.0 / 16384.0)
    f = (alpha[None, :] * (down / new_down)[:, None])[:, :, None]  # [NG, M, 1]
    acc_a, acc_b = pv_dots(hi, lo, v_ptr, rows, valid, acc_a, acc_b, f, NG, EXACT, HALVES)
    return acc_a, acc_b, new_down



@triton.jit
def _prompt_imma_cells_kernel(q_ptr, out_ptr, parts_ptr, ml_ptr, cells_ptr, members_ptr, count_ptr, page_table_ptr,
                              k_ptr, v_ptr, ks_ptr, vs_ptr, block0, n_q, row_len, n_kv_heads, scale_log2,
                              vbound_ptr, G: tl.constexpr, HP: tl.constexpr, BQ: tl.constexpr, BM: tl.constexpr,
                              CH: tl.constexpr, TRANSLATED: tl.constexpr, SPLITS: tl.constexpr,
                              PREFETCH: tl.constexpr, NG: tl.constexpr, PV: tl.constexpr = 16,
                              EXACT: tl.constexpr = 0, QPARTS: tl.constexpr = 3, HALVES: tl.constexpr = False,
                              EARLY: tl.constexpr = 0, UNIFORM: tl.constexpr = False,
                              AHEAD: tl.constexpr = False, PAIRS: tl.constexpr = False, SIDE: tl.constexpr = False,
                              PREFIX: tl.constexpr = 0, FBQ: tl.constexpr = 1, REVERSE: tl.constexpr = False):
    D: tl.constexpr = NG * 64
    blk, kvh, slot, head, ok = block_rows(block0, n_q, n_kv_heads, G, HP, BQ, BM, REVERSE)
    cells_row, members_row, count, ok, w_row = block_source(cells_ptr, members_ptr, count_ptr, blk, n_q, row_len,
                                                            slot, ok, BQ, PREFIX, FBQ)
    h0, l0, m0, d0 = _q_parts(q_ptr, head, ok, 0, D, QPARTS)
    if NG > 1:
        h1, l1, m1, d1 = _q_parts(q_ptr, head, ok, 1, D, QPARTS)
    if NG > 2:
        h2, l2, m2, d2 = _q_parts(q_ptr, head, ok, 2, D, QPARTS)
        h3, l3, m3, d3 = _q_parts(q_ptr, head, ok, 3, D, QPARTS)
    m = tl.full((BM,), float("-inf"), tl.float32)
    l_cells = tl.zeros((BM, CH), tl.float32)  # the running sum per cell slot: rows summed across warps once, at the end
    if PV == 16:  # accumulators in units of `down` (_pv_rescaled)
        acc_a = tl.zeros((NG, BM, 32 if HALVES or PAIRS else 64), tl.float32)
        acc_b = tl.zeros((NG, BM, 32), tl.float32)  # unused without HALVES
        down = tl.full((NG,), 1.0, tl.float32)
        if UNIFORM:  # u1: one bound for every chunk (the pool's largest V scale, > 0)
            vbound = tl.load(vbound_ptr + tl.arange(0, NG) * 0).to(tl.float32)  # [NG]: a per-group bound's layout
            vbound = tl.where(vbound > 0, vbound, 1.0)  # an all-zero pool's bound: 1
            up = 16384.0 / vbound
            down = vbound * (1.0 / 16384.0)
            vbound_one = tl.load(vbound_ptr).to(tl.float32)
            up_one = 16384.0 / tl.where(vbound_one > 0, vbound_one, 1.0)  # v1: the same up, a scalar
    else:
        acc = tl.zeros((NG, BM, 64), tl.float32)
    gi = tl.arange(0, NG)
    g3 = gi[:, None, None]
    d = tl.arange(0, 64)[None, None, :]
    c_lo, c_hi = split_range(count, CH, SPLITS)
    if PREFETCH:
        rows_next, valid_next = cell_rows(cells_row, page_table_ptr, c_lo, count, kvh, n_kv_heads, CH, TRANSLATED)
    if AHEAD and SIDE:  # a1 v1: the first chunk's scales as columns
        ks0, ks1, ks2, ks3, vc0, vc1, vc2, vc3 = columns_at(cells_row, page_table_ptr, ks_ptr, vs_ptr, c_lo, count,
                                                             kvh, n_kv_heads, NG, CH, TRANSLATED)
    elif AHEAD:  # a1: the first chunk's scales; each step then loads the next chunk's
        ks0, ks1, ks2, ks3, vs_ahead = scales_at(cells_row, page_table_ptr, ks_ptr, vs_ptr, c_lo, count, kvh,
                                                  n_kv_heads, NG, CH, TRANSLATED)
    for c0 in range(c_lo, c_hi, CH):
        if PREFETCH:  # this chunk's rows came with the previous step; the next chunk's load now
            rows, valid = rows_next, valid_next
            rows_next, valid_next = cell_rows(cells_row, page_table_ptr, c0 + CH, count, kvh, n_kv_heads, CH,
                                              TRANSLATED)
            if PREFIX == 1:
                attend = prefix_attend(c0, valid, w_row, CH)
            else:
                attend = cell_attend(members_row, c0, valid, slot, CH, BQ)
        elif PREFIX == 1:  # a row attends to the last query's entries below its own query's width
            rows, valid = cell_rows(cells_row, page_table_ptr, c0, count, kvh, n_kv_heads, CH, TRANSLATED)
            attend = prefix_attend(c0, valid, w_row, CH)
        else:
            rows, valid, attend = block_chunk(cells_row, members_row, page_table_ptr, c0, count, kvh, n_kv_heads,
                                              slot, CH, BQ, TRANSLATED)
        if EARLY >= 1:
            ks_tile = _scale_tile(ks_ptr, rows, valid, NG)
        else:
            ks_tile = 0.0  # unused
        if AHEAD:
            if SIDE:
                vs_now = (vc0, vc1, vc2, vc3)
            else:
                vs_now = vs_ahead
            s = _group_part(h0, l0, m0, d0, k_ptr, ks_ptr, rows, valid, 0, NG, QPARTS, ks0, 2, BM)
            if NG > 1:
                s = s + _group_part(h1, l1, m1, d1, k_ptr, ks_ptr, rows, valid, 1, NG, QPARTS, ks1, 2, BM)
            if NG > 2:
                s = s + _group_part(h2, l2, m2, d2, k_ptr, ks_ptr, rows, valid, 2, NG, QPARTS, ks2, 2, BM)
                s = s + _group_part(h3, l3, m3, d3, k_ptr, ks_ptr, rows, valid, 3, NG, QPARTS, ks3, 2, BM)
            if SIDE:
                ks0, ks1, ks2, ks3, vc0, vc1, vc2, vc3 = columns_at(cells_row, page_table_ptr, ks_ptr, vs_ptr,
                                                                     c0 + CH, count, kvh, n_kv_heads, NG, CH,
                                                                     TRANSLATED)
            else:
                ks0, ks1, ks2, ks3, vs_ahead = scales_at(cells_row, page_table_ptr, ks_ptr, vs_ptr, c0 + CH, count,
                                                          kvh, n_kv_heads, NG, CH, TRANSLATED)
        else:
            vs_now = 0.0  # unused
            s = _group_part(h0, l0, m0, d0, k_ptr, ks_ptr, rows, valid, 0, NG, QPARTS, ks_tile, EARLY >= 1, BM)
            if NG > 1:
                s = s + _group_part(h1, l1, m1, d1, k_ptr, ks_ptr, rows, valid, 1, NG, QPARTS, ks_tile, EARLY >= 1,
                                    BM)
            if NG > 2:
                s = s + _group_part(h2, l2, m2, d2, k_ptr, ks_ptr, rows, valid, 2, NG, QPARTS, ks_tile, EARLY >= 1,
                                    BM)
                s = s + _group_part(h3, l3, m3, d3, k_ptr, ks_ptr, rows, valid, 3, NG, QPARTS, ks_tile, EARLY >= 1,
                                    BM)
        s = tl.where(attend, s * scale_log2, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        e = tl.exp2(s - m_use[:, None])
        alpha = tl.exp2(m - m_use)
        m = m_new
        l_cells = l_cells * alpha[:, None] + e
        if PV == 16 and UNIFORM:
            acc_a, acc_b = pv_uniform(e, v_ptr, vs_ptr, rows, valid, acc_a, acc_b, alpha, up, NG, EXACT, HALVES,
                                       vs_now, AHEAD, PAIRS, SIDE, up_one)
        elif PV == 16:
            acc_a, acc_b, down = _pv_rescaled(e, v_ptr, vs_ptr, rows, valid, acc_a, acc_b, alpha, down, NG, EXACT,
                                              HALVES, EARLY >= 2, BM)
        elif PV == 8:
            v = tl.load(v_ptr + rows[None, :, None] * D + g3 * 64 + d, mask=valid[None, :, None], other=0)
            vs = tl.load(vs_ptr + rows[None, :] * NG + gi[:, None], mask=valid[None, :], other=0.0).to(tl.float32)
            a = e[None, :, :] * vs[:, None, :]  # [NG, BM, CH]
            amax = tl.max(a, axis=2)
            ph, pl, pm = split3(a * tl.where(amax > 0, tl.math.div_rn(tl.zeros_like(amax) + 127.0, amax),
                                             0.0)[:, :, None])
            acc = acc * alpha[None, :, None] + dot3(ph, pl, pm, v) * (amax * (1.0 / 127.0))[:, :, None]
        else:  # 0: no P.V (the sweep's probe)
            acc = acc * alpha[None, :, None]
    if PV == 16:
        if PAIRS:  # o1: dim 2j from acc_a, 2j + 1 from acc_b
            acc_a = tl.reshape(tl.join(acc_a, acc_b), (NG, BM, 64))
        elif HALVES:
            acc_a = join_halves(acc_a, acc_b, NG, BM)
        acc = acc_a * down[:, None, None]
    block_store(out_ptr, parts_ptr, ml_ptr, acc, m, tl.sum(l_cells, axis=1), head, ok, NG, SPLITS)
