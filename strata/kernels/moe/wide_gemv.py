"""The decode expert GEMVs (and the dense matvec) for Q2_0, Q4_0, Q8_0 and Q4_K, a thread per packed word of codes.

The byte kernels of gemv.py decode a [rows x blocks x 32] tile that Triton lays out with the 32 weights of a block
across the lanes of a warp: a thread holds one weight of a block, so it loads a byte and converts it (a quarter-rate
instruction on Hopper) per weight. These kernels' tile is [NU units, BN rows, NT words]: a unit is a Q2_0 / Q4_0 /
Q8_0 block or a Q4_K slice pair (64 weights), a word the uint16 (Q2_0: 8 weights, Q4_0: 4, Q8_0: 2; those blocks
are only 2-byte aligned, the width llama.cpp's CUDA kernels read them at) or uint32 (Q4_K: 8) one thread loads
and unpacks with shifts and masks. A code becomes a float without a conversion: `code | 0x4B000000` read as float32 is
2^23 + code exactly, so one subtraction gives code - offset exactly. Units come first in the tile so that Triton
spreads lanes over units and words and wraps the BN rows inside each thread: the activations a thread loads (one
load of adjacent pairs or quads, split in registers) serve all its rows, and each unit's dot is scaled once:
  Q2_0 / Q4_0 / Q8_0: d * sum_j q_j x_j;   Q4_K: per 32-weight half, d*sc * sum q_j x_j - dmin*m * sum x_j.
The down kernel flattens (chosen expert, unit) into one unit axis, so a token's k experts fill one program's lanes
(the expert's weight scales its units' dots); a program covers BN output rows, and the final sum over units and
words is a fixed-order tree in registers: deterministic, no atomics, no zero-fill. Where the grid of row blocks is
too small to keep an H200's SMs loading (`word_tile`), the input is cut in SPLIT slices, a program each (grid axis
2), whose float32 partial sums a second launch adds in slice order (`_split_sum_kernel`; gate/up: then SwiGLU).

Contracts are gemv.py's: y[t] = sum_j w[t, j] * W_{e_j} h[t, j], H = silu(x Wg^T) * (x Wu^T), experts through the
slot table, a slot < 0 contributing exactly zero. Precision: float32 sums of exact products; the per-unit factoring
changes only the rounding order, within the kernels' ERROR_BOUND of float64 (the tests hold it there).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from strata.kernels.moe.decode import DecodeSpec, code_tables
from strata.kernels.moe.grid_words import GRID_FORMATS, grid_unit_dot
from strata.kernels.moe.word_loads import codes, pairs, quads
from strata.kernels.pdl import launch_options, pdl_start, pdl_wait

WORDS = {"Q2_0": 8, "Q4_0": 8, "Q8_0": 16, "Q4_K": 8, **{name: 4 for name in GRID_FORMATS}}  # words (threads) a unit
UNIT = {"Q2_0": 64, "Q4_0": 32, "Q8_0": 32, "Q4_K": 64, **{name: 32 for name in GRID_FORMATS}}  # weights a unit

def word_gemv_applies(spec: DecodeSpec, *byte_offsets: int) -> bool:
    """A format this kernel reads, with every block start aligned for its words (2 bytes; Q4_K: 4)."""
    align = 4 if spec.name == "Q4_K" else 2  # the others' blocks are only 2-byte aligned
    return spec.name in WORDS and all(offset % align == 0 for offset in byte_offsets)


@triton.jit
def _unit_dot(FMT: tl.constexpr, w, row_base, blk, x_at, t, um, bm, tab):
    """The scaled partial dots [NU, BN, NT] of NU units against their activations: unit u is unit blk[u] of the
    rows starting at bytes row_base[u, :] of w, its activations start at pointer x_at[u]; um [NU]: units in range,
    bm [NU, BN]: units to read. (Units first: Triton then spreads lanes over units and words and wraps the rows
    inside each thread, so a thread's activations serve all BN rows.) tab: `decode.code_tables` (the i-quants)."""
    m = bm[:, :, None]
    if FMT == 6 or FMT == 8 or FMT == 9:  # IQ2_XS, IQ3_XXS, IQ3_S
        return grid_unit_dot(FMT, w, row_base, blk, x_at, t, um, bm, tab)
    elif FMT == 0:  # Q2_0: halfword t of a block holds weights 8t..8t+7, two bits each, weight = d * (code - 1)
        h16 = w.to(tl.pointer_type(tl.uint16))
        first = row_base // 2 + (blk * 9)[:, None]
        word = tl.load(h16 + first[:, :, None] + 1 + t[None, None, :], mask=m, other=0).to(tl.uint32)
        d = tl.load(h16 + first, mask=bm, other=0).to(tl.float16, bitcast=True).to(tl.float32)
        x0, x1, x2, x3 = quads(x_at, 2 * t, um)  # the activations of weights 8t..8t+3
        s = codes(word, 0, 3, 1.0) * x0[:, None, :] + codes(word, 2, 3, 1.0) * x1[:, None, :]
        s += codes(word, 4, 3, 1.0) * x2[:, None, :] + codes(word, 6, 3, 1.0) * x3[:, None, :]
        x0, x1, x2, x3 = quads(x_at + 4, 2 * t, um)  # and of 8t+4..8t+7
        s += codes(word, 8, 3, 1.0) * x0[:, None, :] + codes(word, 10, 3, 1.0) * x1[:, None, :]
        s += codes(word, 12, 3, 1.0) * x2[:, None, :] + codes(word, 14, 3, 1.0) * x3[:, None, :]
        return s * d[:, :, None]
    elif FMT == 1:  # Q4_0: halfword t of a block holds weights 2t, 2t+1 (low nibbles) and 2t+16, 2t+17 (high)
        h16 = w.to(tl.pointer_type(tl.uint16))
        first = row_base // 2 + (blk * 9)[:, None]  # [NU, BN]: the halfword of each block's d
        word = tl.load(h16 + first[:, :, None] + 1 + t[None, None, :], mask=m, other=0).to(tl.uint32)
        d = tl.load(h16 + first, mask=bm, other=0).to(tl.float16, bitcast=True).to(tl.float32)
        x0, x1 = pairs(x_at, t, um)  # the activations of weights 2t, 2t + 1
        x16, x17 = pairs(x_at + 16, t, um)
        s = codes(word, 0, 15, 8.0) * x0[:, None, :]
        s += codes(word, 8, 15, 8.0) * x1[:, None, :]
        s += codes(word, 4, 15, 8.0) * x16[:, None, :]
        s += codes(word, 12, 15, 8.0) * x17[:, None, :]
        return s * d[:, :, None]
    elif FMT == 2:  # Q8_0: halfword t holds int8 codes 2t, 2t+1 (read as q + 128: the byte's top bit flipped)
        h16 = w.to(tl.pointer_type(tl.uint16))
        first = row_base // 2 + (blk * 17)[:, None]
        word = tl.load(h16 + first[:, :, None] + 1 + t[None, None, :], mask=m, other=0).to(tl.uint32) ^ 0x8080
        d = tl.load(h16 + first, mask=bm, other=0).to(tl.float16, bitcast=True).to(tl.float32)
        x0, x1 = pairs(x_at, t, um)
        s = codes(word, 0, 255, 128.0) * x0[:, None, :]
        s += codes(word, 8, 255, 128.0) * x1[:, None, :]
        return s * d[:, :, None]
    else:  # Q4_K: unit = slice pair blk % 4 of super-block blk // 4; word t holds weights 4t..4t+3 of both halves
        pair = blk % 4
        block = row_base + ((blk // 4) * 144)[:, None]  # [NU, BN]: the byte of each super-block
        w32 = w.to(tl.pointer_type(tl.uint32))
        at = (block + (16 + 32 * pair)[:, None]) // 4
        word = tl.load(w32 + at[:, :, None] + t[None, None, :], mask=m, other=0).to(tl.uint32)
        x0, x1, x2, x3 = quads(x_at, t, um)  # weights 4t..4t+3 of the low half
        dot_lo = codes(word, 0, 15, 0.0) * x0[:, None, :] + codes(word, 8, 15, 0.0) * x1[:, None, :]
        dot_lo += codes(word, 16, 15, 0.0) * x2[:, None, :] + codes(word, 24, 15, 0.0) * x3[:, None, :]
        sum_lo = (x0 + x1) + (x2 + x3)
        x0, x1, x2, x3 = quads(x_at + 32, t, um)  # and of the high half
        dot_hi = codes(word, 4, 15, 0.0) * x0[:, None, :] + codes(word, 12, 15, 0.0) * x1[:, None, :]
        dot_hi += codes(word, 20, 15, 0.0) * x2[:, None, :] + codes(word, 28, 15, 0.0) * x3[:, None, :]
        sum_hi = (x0 + x1) + (x2 + x3)
        scales = w + block + 2 * pair[:, None]  # sub-block 2*pair's 6-bit scale/min bytes (and the next one's)
        a0 = tl.load(scales + 4, mask=bm, other=0).to(tl.int32)
        a1 = tl.load(scales + 5, mask=bm, other=0).to(tl.int32)
        c0 = tl.load(scales + 8, mask=bm, other=0).to(tl.int32)
        c1 = tl.load(scales + 9, mask=bm, other=0).to(tl.int32)
        e0 = tl.load(scales, mask=bm, other=0).to(tl.int32)
        e1 = tl.load(scales + 1, mask=bm, other=0).to(tl.int32)
        low = pair[:, None] < 2  # sub-blocks 0..3 keep their 6 bits in place; 4..7 split them
        sc0 = tl.where(low, a0 & 63, (c0 & 15) | ((e0 >> 2) & 48)).to(tl.float32)
        sc1 = tl.where(low, a1 & 63, (c1 & 15) | ((e1 >> 2) & 48)).to(tl.float32)
        mn0 = tl.where(low, c0 & 63, (c0 >> 4) | ((a0 >> 2) & 48)).to(tl.float32)
        mn1 = tl.where(low, c1 & 63, (c1 >> 4) | ((a1 >> 2) & 48)).to(tl.float32)
        h16 = w.to(tl.pointer_type(tl.uint16))
        d = tl.load(h16 + block // 2, mask=bm, other=0).to(tl.float16, bitcast=True).to(tl.float32)
        dmin = tl.load(h16 + block // 2 + 1, mask=bm, other=0).to(tl.float16, bitcast=True).to(tl.float32)
        part = dot_lo * (d * sc0)[:, :, None] + dot_hi * (d * sc1)[:, :, None]
        return part - (dmin * mn0)[:, :, None] * sum_lo[:, None, :] - (dmin * mn1)[:, :, None] * sum_hi[:, None, :]


@triton.jit
def _expert_units(ids, slot_of, token, g, um, TOP_K: tl.constexpr, N_UNITS: tl.constexpr, SLOTS: tl.constexpr):
    """For flat unit indices g [NU] over (chosen expert j, unit of the row): j, the unit, and the operand index
    (-1: not resident)."""
    j = g // N_UNITS
    index = tl.load(ids + token * TOP_K + j, mask=um, other=0).to(tl.int32)
    if SLOTS:
        index = tl.load(slot_of + index, mask=um, other=-1).to(tl.int32)
    return j, g % N_UNITS, tl.where(um, index, -1)


@triton.jit
def _slice_of(SPLIT: tl.constexpr, PER: tl.constexpr, TOTAL: tl.constexpr):
    """The units [start, end) of this program's slice of the input (program axis 2): all of them unsplit."""
    if SPLIT == 1:
        start = 0
        end = TOTAL
    else:
        start = tl.program_id(2) * PER
        end = tl.minimum(start + PER, TOTAL)
    return start, end


@triton.jit
def _word_down_kernel(h, ids, topk_w, slot_of, wd, tab, y, n_out, stride_d, row_bytes,
                      TOP_K: tl.constexpr, K: tl.constexpr, FMT: tl.constexpr, N_UNITS: tl.constexpr,
                      UNIT_W: tl.constexpr, NT: tl.constexpr, SLOTS: tl.constexpr, BN: tl.constexpr,
                      NU: tl.constexpr, SPLIT: tl.constexpr, PER: tl.constexpr):
    """y[t, rows] = sum over the chosen experts j and their units of w[t, j] * (unit's rows . h[t, j]'s slice);
    split (SPLIT > 1): slice s of the units into y[s, t, rows], summed after by `_split_sum_kernel`."""
    token = tl.program_id(0)
    rows = tl.program_id(1) * BN + tl.arange(0, BN)
    live_rows = rows < n_out
    t = tl.arange(0, NT)
    acc = tl.zeros((NU, BN, NT), tl.float32)
    start, end = _slice_of(SPLIT, PER, TOP_K * N_UNITS)
    for u0 in range(start, end, NU):  # the units of all chosen experts, flattened
        g = u0 + tl.arange(0, NU)
        um = g < end
        j, blk, index = _expert_units(ids, slot_of, token, g, um, TOP_K, N_UNITS, SLOTS)
        weight = tl.load(topk_w + token * TOP_K + j, mask=um, other=0.0).to(tl.float32)
        row_base = tl.maximum(index, 0).to(tl.int64)[:, None] * stride_d + rows.to(tl.int64)[None, :] * row_bytes
        x_at = h + (token * TOP_K + j).to(tl.int64) * K + blk * UNIT_W
        bm = (index >= 0)[:, None] & live_rows[None, :]
        acc += _unit_dot(FMT, wd, row_base, blk, x_at, t, um, bm, tab) * weight[:, None, None]
    out = tl.sum(tl.sum(acc, axis=2), axis=0)
    at = (tl.program_id(2) * tl.num_programs(0) + token).to(tl.int64) * n_out + rows
    tl.store(y + at, out, mask=live_rows)


@triton.jit
def _word_gate_up_kernel(x, ids, slot_of, wg, wu, tab, hid, n_ff, stride_g, stride_u, row_bytes,
                         TOP_K: tl.constexpr, K: tl.constexpr, FMT: tl.constexpr, N_UNITS: tl.constexpr,
                         UNIT_W: tl.constexpr, NT: tl.constexpr, SLOTS: tl.constexpr, BN: tl.constexpr,
                         NU: tl.constexpr, SPLIT: tl.constexpr, PER: tl.constexpr):
    """H[pair, rows] = silu(gate rows . x) * (up rows . x) of one (token, chosen expert) pair; split: slice s's
    gate and up dots into hid[s, 0 / 1, pair, rows], combined after by `_split_sum_kernel`."""
    pair = tl.program_id(0)
    token = pair // TOP_K
    rows = tl.program_id(1) * BN + tl.arange(0, BN)
    live_rows = rows < n_ff
    t = tl.arange(0, NT)
    acc_g = tl.zeros((NU, BN, NT), tl.float32)
    acc_u = tl.zeros((NU, BN, NT), tl.float32)
    start, end = _slice_of(SPLIT, PER, N_UNITS)
    for u0 in range(start, end, NU):
        blk = u0 + tl.arange(0, NU)
        um = blk < end
        index = tl.load(ids + pair + blk * 0, mask=um, other=0).to(tl.int32)  # [NU]: the pair's expert, per unit
        if SLOTS:
            index = tl.load(slot_of + index, mask=um, other=-1).to(tl.int32)
        index = tl.where(um, index, -1)
        expert = tl.maximum(index, 0).to(tl.int64)[:, None]
        rows_at = rows.to(tl.int64)[None, :] * row_bytes
        x_at = x + token.to(tl.int64) * K + blk * UNIT_W
        bm = (index >= 0)[:, None] & live_rows[None, :]
        acc_g += _unit_dot(FMT, wg, expert * stride_g + rows_at, blk, x_at, t, um, bm, tab)
        acc_u += _unit_dot(FMT, wu, expert * stride_u + rows_at, blk, x_at, t, um, bm, tab)
    g = tl.sum(tl.sum(acc_g, axis=2), axis=0)
    u = tl.sum(tl.sum(acc_u, axis=2), axis=0)
    store_gate_up(hid, pair, rows, g, u, n_ff, live_rows, SPLIT)


@triton.jit
def store_gate_up(hid, pair, rows, g, u, n_ff, live, SPLIT: tl.constexpr):
    """A gate/up program's rows: silu(g) * u into hid [pairs, n_ff], or with SPLIT slices its partial dots into
    hid [SPLIT, 2, pairs, n_ff] (slice = program_id(2), pairs = num_programs(0)) for `_split_sum_kernel`."""
    if SPLIT == 1:
        tl.store(hid + pair.to(tl.int64) * n_ff + rows, g / (1.0 + tl.exp(-g)) * u, mask=live)
    else:
        at = (tl.program_id(2) * 2 * tl.num_programs(0) + pair).to(tl.int64) * n_ff + rows
        tl.store(hid + at, g, mask=live)
        tl.store(hid + at + tl.num_programs(0) * n_ff, u, mask=live)


@triton.jit
def _split_sum_kernel(part, out, n, SPLIT: tl.constexpr, SWIGLU: tl.constexpr, BLOCK: tl.constexpr,
                      PDL: tl.constexpr = 0):
    """out[i] = sum over s of part[s, i], s in order (deterministic); SWIGLU: part [S, 2, n] holds gate and up
    dots, out = silu(gate) * up. PDL (kernels/pdl.py): every read is of the slices' kernel's output."""
    pdl_start(PDL)
    pdl_wait(PDL)
    at = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = at < n
    stride = 2 * n if SWIGLU else n
    acc = tl.load(part + at, mask=live, other=0.0)
    for s in tl.static_range(1, SPLIT):
        acc += tl.load(part + s * stride + at, mask=live, other=0.0)
    if SWIGLU:
        up = tl.load(part + n + at, mask=live, other=0.0)
        for s in tl.static_range(1, SPLIT):
            up += tl.load(part + s * stride + n + at, mask=live, other=0.0)
        acc = acc / (1.0 + tl.exp(-acc)) * up
    tl.store(out + at, acc, mask=live)


def cover(n: int, target: int) -> int:
    """The largest power of two <= target (and <= n rounded up) whose multiples pad n by at most a quarter."""
    p = 1
    while p * 2 <= target and p < n:
        p *= 2
    while p > 1 and -(-n // p) * p - n > n // 4:
        p //= 2
    return p


SMS = 132  # H200's SMs: the grid the GPU defaults are reasoned for
WARPS_PER_SM = 32  # half of sm_90's 64 resident warps: fewer leave too few loads in flight to cover HBM latency


def word_tile(spec: DecodeSpec, n_out: int, n_units: int, on_gpu: bool, programs: int = 1
              ) -> tuple[int, int, int, int]:
    """(BN rows, NU units per step, warps, SPLIT slices of the input) for n_out rows and `n_units` units a step
    could cover, over `programs` (tokens or pairs) programs a row block: on a GPU a unit per thread over up to 512
    threads (enough 16-bit loads in flight to cover HBM latency), each thread holding 8 rows (4 below 4096 rows, so
    that the n_out / BN programs still fill an H200's 132 SMs; the activations then serve 4 rows), and the input
    split in 2 or 4 slices (a second, small launch sums them) only where the grid would leave fewer than
    WARPS_PER_SM warps an SM and each slice keeps two steps (qwen4exp's Q2_0 down projection: 2560 rows, 100 units
    of 16); under the interpreter, whose cost is per operation, the widest tiles."""
    if not on_gpu:
        return min(128, 1 << (n_out - 1).bit_length()), min(64, 1 << (n_units - 1).bit_length()), 4, 1
    nu = cover(n_units, 512 // WORDS[spec.name])
    bn = 8 if n_out >= 4096 else 4
    warps = max(1, min(16, nu * WORDS[spec.name] // 32))
    split = 1
    while split < 4 and programs * -(-n_out // bn) * warps * split < SMS * WARPS_PER_SM and n_units >= 4 * split * nu:
        split *= 2
    return bn, nu, warps, split


def units_per_slice(n_units: int, nu: int, split: int) -> int:
    """PER: the units of each of `split` slices, whole steps of nu."""
    return -(-(-(-n_units // split)) // nu) * nu


def _sum_slices(part: torch.Tensor, out: torch.Tensor, split: int, swiglu: bool) -> None:
    n = out.numel()
    block = 1024
    _split_sum_kernel[(triton.cdiv(n, block),)](part, out, n, SPLIT=split, SWIGLU=swiglu, BLOCK=block, num_warps=4,
                                                **launch_options(part))


def _tables(spec: DecodeSpec, raw: torch.Tensor) -> torch.Tensor:
    """The i-quants' packed grids (in `code_tables`, as the byte kernels' grids); the others read none, so they get
    their own weights as a stand-in pointer and never depend on a table's first copy (not capturable)."""
    return code_tables(raw.device) if spec.name in GRID_FORMATS else raw


def launch_word_down(h, topk_ids, topk_weights, d, slot_of, y, spec: DecodeSpec, bn: int, nu: int, warps: int,
                     split: int = 1):
    """`_word_down_kernel` over operand d (gemv.ExpertOperand) into y [T, d.rows]: the down kernel's contract."""
    n_tokens, top_k = topk_ids.shape
    slots = slot_of is not None
    n_units = d.cols // UNIT[spec.name]
    out = y if split == 1 else torch.empty(split, *y.shape, dtype=torch.float32, device=y.device)
    _word_down_kernel[(n_tokens, triton.cdiv(d.rows, bn), split)](
        h, topk_ids.contiguous(), topk_weights.contiguous(), slot_of if slots else topk_ids, d.raw,
        _tables(spec, d.raw), out, d.rows,
        d.stride, d.row_bytes, TOP_K=top_k, K=d.cols, FMT=spec.fmt_id, N_UNITS=n_units, UNIT_W=UNIT[spec.name],
        NT=WORDS[spec.name], SLOTS=slots, BN=bn, NU=nu, SPLIT=split, PER=units_per_slice(top_k * n_units, nu, split),
        num_warps=warps)
    if split > 1:
        _sum_slices(out, y, split, False)
    return y


def launch_word_gate_up(x, topk_ids, g, u, slot_of, hid, spec: DecodeSpec, bn: int, nu: int, warps: int,
                        split: int = 1):
    """`_word_gate_up_kernel` over operands g, u into H [T, k, ff] (float32): gate_up_swiglu's contract."""
    n_tokens, top_k = topk_ids.shape
    slots = slot_of is not None
    n_units = g.cols // UNIT[spec.name]
    out = hid if split == 1 else torch.empty(split, 2, *hid.shape, dtype=torch.float32, device=hid.device)
    _word_gate_up_kernel[(n_tokens * top_k, triton.cdiv(g.rows, bn), split)](
        x.contiguous(), topk_ids.contiguous(), slot_of if slots else topk_ids, g.raw, u.raw,
        _tables(spec, g.raw), out, g.rows, g.stride,
        u.stride, g.row_bytes, TOP_K=top_k, K=g.cols, FMT=spec.fmt_id, N_UNITS=n_units, UNIT_W=UNIT[spec.name],
        NT=WORDS[spec.name], SLOTS=slots, BN=bn, NU=nu, SPLIT=split, PER=units_per_slice(n_units, nu, split),
        num_warps=warps)
    if split > 1:
        _sum_slices(out, hid, split, True)
    return hid
