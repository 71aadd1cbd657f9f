"""Decode GEMVs over Q4_0 weights with an int8 activation: each 32-weight block's dot is integer `dp4a`s (issue 4;
the decode step takes them under STRATA_DP4A: models/dp4a_step.py).

The one-shot float kernels (`oneshot_gemv.py`) spend ~7 instructions a weight turning 4-bit codes into floats and
multiplying them, and issuing those instructions is most of their time beyond the bare read of the weights. Here the
activation is rounded once to int8 codes per 32 values (`quantize_x`: a float32 scale d_x and the codes' sum a block,
`quantize32`'s rounding), and a block's dot with a weight row is integer work: the block's 16 code bytes are 4
uint32 words; each word's low nibbles (weights 4i..4i+3) masked to bytes go through one `dp4a` (four byte
multiply-adds into an int32) against the activation's codes 4i..4i+3 (read as an int32 word), its high nibbles
(16+4i..) masked in place (bytes 16 q) through another, into a second sum divided by 16 once (exact). The Q4_0
offset is taken once a block: the first sum starts at -8 x the block's activation code sum, so
    row . x ~ sum over blocks of d_w * d_x * (sum_i q_i * c_i - 8 * sum_i c_i)       (q_i the 4-bit code, c_i x's)
with the integer part exact, then one conversion and one float multiply-add a block. Built for sm_90 (the last test
of test_dp4a_gemv.py prints the counts) that is 1.5-2.2 instructions a weight (pairs layout; blocks 2.1-2.7), all
included, against the float one-shot kernels' 6.3-7.8 at A3B's shapes.

Layout (a program: BN rows of one weight matrix, all its blocks at once, no loop over the input: the one-shot
form): tiles [NU units, BN rows], Triton spreading the units over a warp's lanes and the rows over registers and
warps, so that the activation words a thread loads serve all its rows. Q4_0 blocks are 18 bytes (an fp16 scale then
the codes), so in GGUF order every other block's codes are only 2-byte aligned. LAYOUTS (a tunable):
  pairs      (the default where K is a multiple of 64 and the bytes 4-aligned) a unit is two blocks, 36 bytes,
             read as 9 uint32 words, the even block's code words funnel-shifted out of words 0..4: half the load
             instructions of `blocks`, ~20 % fewer instructions;
  blocks     a unit is a block, each code word two uint16 loads;
  halfwords  a lane a halfword of codes, 8 a block: a load instruction reads 4 blocks' codes in a row (the float
             kernels' coalesced loads) where the other two read 2 bytes of each of 32 blocks (the L1 serving each
             line ~9 times), at ~2x the instructions: the probe's check of whether that binds.
The sums reduce once per program over the units.

`dp4a` is PTX `dp4a.u32.s32` (unsigned weight bytes, signed activation bytes) through inline assembly; Triton's
interpreter cannot run assembly, so under TRITON_INTERPRET=1 the same function is plain integer operations, and
the CPU tests run these kernels as they are.

Error (`row_error_bound`, asserted by tests/kernels/moe/test_dp4a_gemv.py and printed by tools/device/
dp4a_probe.py): against float64 of the dequantized weights times the ORIGINAL x, a row is within sum over blocks of
(d_x / 2) * sum |w| of the block (x rounded to the nearest code) plus float32 rounding of the products and sums:
not gemv.ERROR_BOUND's 1e-5 relative, since x itself is rounded (A3B-like rows: ~0.5 % of max |row|, where the
float kernels are within 1e-7), so wiring it into the engine changes logits and wants its own opt-in switch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from strata.errors import StrataError
from strata.kernels import INTERPRETED  # decided before Triton was imported
from strata.kernels.pdl import launch_options, pdl_start, pdl_wait
from strata.kernels.moe.quantize32 import (GROUP, quantize_rows_ref, quantize_rows_triton, round_groups,
                                           rounded_rows_buffers)
from strata.kernels.work_arena import AllocatorScratch

BLOCK_BYTES = 18  # Q4_0: fp16 scale, 16 bytes of codes
LAYOUTS = ("blocks", "halfwords", "pairs")  # a lane a block, a halfword, a pair of blocks (the module's docstring)
LANE_BLOCKS = 8  # block rows a thread holds at most (36 code words): the old kernels' registers and then some
MIN_WARPS = 12 * 132  # resident warps the grid should give an H200 (12 an SM, as oneshot_gemv's tiles)


@triton.jit
def dp4a_emulated(a, b, c):
    """c + the dot of a's four unsigned bytes with b's four signed bytes (int32 each), in plain integer operations."""
    for k in tl.static_range(4):
        c += ((a >> (8 * k)) & 255) * ((b << (24 - 8 * k)) >> 24)  # b's byte k sign-extended (arithmetic >>)
    return c


if INTERPRETED:
    @triton.jit
    def dp4a(a, b, c):
        return dp4a_emulated(a, b, c)
else:
    @triton.jit
    def dp4a(a, b, c):
        """c + a's unsigned bytes . b's signed bytes, one instruction (IDP.4A on sm_61 and newer)."""
        return tl.inline_asm_elementwise("dp4a.u32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=tl.int32,
                                         is_pure=True, pack=1)


@triton.jit
def _word(at, i: tl.constexpr):
    """Code word i [NU, BN] (int32: code bytes 4i..4i+3 of the blocks at `at`) from the uint16s at 2 + 4i, 4 + 4i."""
    lo = tl.load((at + 2 + 4 * i).to(tl.pointer_type(tl.uint16)))
    hi = tl.load((at + 4 + 4 * i).to(tl.pointer_type(tl.uint16)))
    return lo.to(tl.int32) | (hi.to(tl.int32) << 16)


@triton.jit
def _codes(w_at, off):
    """The 4 code words [NU, BN] (int32) and the scales [NU, BN] (float32) of the blocks `off` [NU, BN] bytes after
    w_at (a pointer, or [NU, 1] of them). No masks (nor in the other layouts' loads): callers address only bytes of
    the matrices (rows past the end clamped to the last, padding units to real blocks), which saves a zeroing
    instruction a load; what such a block gives is multiplied by a zero activation or not stored."""
    at = w_at + off
    d = tl.load(at.to(tl.pointer_type(tl.uint16))).to(tl.float16, bitcast=True).to(tl.float32)
    return _word(at, 0), _word(at, 1), _word(at, 2), _word(at, 3), d


@triton.jit
def _x_words(xq, xs, xsum, pair, blk, live, K: tl.constexpr):
    """Activation row `pair` [NU] at units blk [NU]: its 8 code words (int32 [NU] each: codes 4i..4i+3, then
    16+4i..; loaded two at a time, a block's 32 bytes being 8-aligned), its scale [NU] and -8 x its code sum [NU]
    (the integer sum's start)."""
    at = xq.to(tl.pointer_type(tl.int64)) + pair.to(tl.int64) * (K // 8) + blk * 4
    x01 = tl.load(at, mask=live, other=0)
    x23 = tl.load(at + 1, mask=live, other=0)
    x45 = tl.load(at + 2, mask=live, other=0)
    x67 = tl.load(at + 3, mask=live, other=0)
    g = pair.to(tl.int64) * (K // 32) + blk
    scale = tl.load(xs + g, mask=live, other=0.0)
    start = tl.load(xsum + g, mask=live, other=0) * -8
    return x01.to(tl.int32), (x01 >> 32).to(tl.int32), x23.to(tl.int32), (x23 >> 32).to(tl.int32), \
        x45.to(tl.int32), (x45 >> 32).to(tl.int32), x67.to(tl.int32), (x67 >> 32).to(tl.int32), scale, start


@triton.jit
def _block_dots(c0, c1, c2, c3, d, x0, x1, x2, x3, x4, x5, x6, x7, scale, start):
    """[NU, BN] float32: d_w * d_x * (q . c - 8 * sum c) of each block. Low nibbles masked to bytes 0..15; high
    ones masked in place (bytes 16 q) into their own sum, divided by 16 once (exact: a multiple of 16)."""
    low = dp4a(c0 & 0x0F0F0F0F, x0[:, None], start[:, None])
    low = dp4a(c1 & 0x0F0F0F0F, x1[:, None], low)
    low = dp4a(c2 & 0x0F0F0F0F, x2[:, None], low)
    low = dp4a(c3 & 0x0F0F0F0F, x3[:, None], low)
    high = dp4a(c0 & -252645136, x4[:, None], tl.zeros_like(low))  # 0xF0F0F0F0
    high = dp4a(c1 & -252645136, x5[:, None], high)
    high = dp4a(c2 & -252645136, x6[:, None], high)
    high = dp4a(c3 & -252645136, x7[:, None], high)
    return (low + (high >> 4)).to(tl.float32) * (d * scale[:, None])  # |int| < 2^17: exact in float32


@triton.jit
def _halfword_codes(w_at, off):
    """The HALFWORDS layout's loads: [NU, BN, 8] int32, halfword t of each block's codes (bytes 2t, 2t+1) spread to
    the bytes q(2t), q(2t+1), q(2t+16), q(2t+17) (h | h << 12, masked), and the scales [NU, BN] (float32). A load
    instruction reads 4 blocks' 16 code bytes in a row, 8 lanes a block (the float one-shot kernels' layout)."""
    at = w_at + off
    h = tl.load((at + 2)[:, :, None].to(tl.pointer_type(tl.uint16)) + tl.arange(0, 8)[None, None, :]).to(tl.int32)
    d = tl.load(at.to(tl.pointer_type(tl.uint16))).to(tl.float16, bitcast=True).to(tl.float32)
    return (h | (h << 12)) & 0x0F0F0F0F, d


@triton.jit
def _x_halfwords(xq, xs, xsum, pair, blk, live, K: tl.constexpr):
    """The HALFWORDS layout's activation [NU, 8] int32: codes 2t, 2t+1, 2t+16, 2t+17 of each block (two uint16
    loads), its scale [NU] and the integer sums' start [NU, 8] (-8 x the block's code sum in lane 0, else 0)."""
    t = tl.arange(0, 8)
    at = xq.to(tl.pointer_type(tl.uint16)) + (pair.to(tl.int64) * (K // 2) + blk * 16)[:, None] + t[None, :]
    lo = tl.load(at, mask=live[:, None], other=0).to(tl.int32)
    hi = tl.load(at + 8, mask=live[:, None], other=0).to(tl.int32)
    g = pair.to(tl.int64) * (K // 32) + blk
    scale = tl.load(xs + g, mask=live, other=0.0)
    start = tl.load(xsum + g, mask=live, other=0)[:, None] * tl.where(t == 0, -8, 0)[None, :]
    return lo | (hi << 16), scale, start


@triton.jit
def _halfword_sums(v, d, xw, scale, start):
    """[BN] row sums of d_w * d_x * (q . c - 8 * sum c) over the HALFWORDS tiles (one reduction over blocks and
    lanes)."""
    shape: tl.constexpr = v.shape
    acc = dp4a(v, tl.broadcast_to(xw[:, None, :], shape), tl.broadcast_to(start[:, None, :], shape))
    part = tl.permute(acc.to(tl.float32) * (d * scale[:, None])[:, :, None], (1, 0, 2))
    return tl.sum(tl.reshape(part, (shape[1], shape[0] * shape[2])), axis=1)


@triton.jit
def _pair_codes(w_at, off):
    """The PAIRS layout's loads: a unit is two blocks (36 bytes, 4-aligned where the row is), read as 9 uint32 words
    (half the loads of two blocks' uint16s): the even block's code words straddle words 0..4 (a funnel shift each),
    the odd block's are words 5..8 as they are; the scales are word 0's low and word 4's high half."""
    at = (w_at + off).to(tl.pointer_type(tl.uint32))
    w0 = tl.load(at)
    w1 = tl.load(at + 1)
    w2 = tl.load(at + 2)
    w3 = tl.load(at + 3)
    w4 = tl.load(at + 4)
    w5 = tl.load(at + 5)
    w6 = tl.load(at + 6)
    w7 = tl.load(at + 7)
    w8 = tl.load(at + 8)
    d0 = (w0 & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    d1 = (w4 >> 16).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    e0 = ((w0 >> 16) | (w1 << 16)).to(tl.int32, bitcast=True)  # (uint32: logical shifts)
    e1 = ((w1 >> 16) | (w2 << 16)).to(tl.int32, bitcast=True)
    e2 = ((w2 >> 16) | (w3 << 16)).to(tl.int32, bitcast=True)
    e3 = ((w3 >> 16) | (w4 << 16)).to(tl.int32, bitcast=True)
    return e0, e1, e2, e3, d0, w5.to(tl.int32, bitcast=True), w6.to(tl.int32, bitcast=True), \
        w7.to(tl.int32, bitcast=True), w8.to(tl.int32, bitcast=True), d1


@triton.jit
def _weights(w_at, off, LAYOUT: tl.constexpr):
    """A tile's weight loads, all issued together, kept as the layout keeps them (a tuple)."""
    if LAYOUT == 1:
        return _halfword_codes(w_at, off)
    elif LAYOUT == 2:
        return _pair_codes(w_at, off)
    else:
        return _codes(w_at, off)


@triton.jit
def _row_sums(wts, xq, xs, xsum, pair, blk, live, weight, K: tl.constexpr, LAYOUT: tl.constexpr):
    """[BN]: the tile's rows (`_weights`) . activation rows `pair` [NU] at units blk [NU] (their first block), each
    unit's d_x times `weight` (an expert's combine weight, or 1)."""
    if LAYOUT == 1:
        v, d = wts
        xw, scale, start = _x_halfwords(xq, xs, xsum, pair, blk, live, K)
        out = _halfword_sums(v, d, xw, scale * weight, start)
    elif LAYOUT == 2:
        e0, e1, e2, e3, d0, o0, o1, o2, o3, d1 = wts
        x0, x1, x2, x3, x4, x5, x6, x7, scale, start = _x_words(xq, xs, xsum, pair, blk, live, K)
        even = _block_dots(e0, e1, e2, e3, d0, x0, x1, x2, x3, x4, x5, x6, x7, scale * weight, start)
        x0, x1, x2, x3, x4, x5, x6, x7, scale, start = _x_words(xq, xs, xsum, pair, blk + 1, live, K)
        odd = _block_dots(o0, o1, o2, o3, d1, x0, x1, x2, x3, x4, x5, x6, x7, scale * weight, start)
        out = tl.sum(even + odd, axis=0)
    else:
        c0, c1, c2, c3, d = wts
        x0, x1, x2, x3, x4, x5, x6, x7, scale, start = _x_words(xq, xs, xsum, pair, blk, live, K)
        out = tl.sum(_block_dots(c0, c1, c2, c3, d, x0, x1, x2, x3, x4, x5, x6, x7, scale * weight, start), axis=0)
    return out


@triton.jit
def _dp4a_down_kernel(xq, xs, xsum, ids, topk_w, w, y, stride, N_OUT: tl.constexpr, K: tl.constexpr,
                      TOP_K: tl.constexpr, NU: tl.constexpr, BN: tl.constexpr, ROWS: tl.constexpr,
                      SHARED: tl.constexpr, LAYOUT: tl.constexpr = 0, PDL: tl.constexpr = 0):
    """y[t, rows] = sum over t's chosen experts j of topk_w[t, j] * (expert ids[t, j]'s rows . x[t * TOP_K + j]),
    every block of every chosen expert loaded at once. SHARED (the dense matvec: one matrix, TOP_K 1, ids and
    topk_w unread): a program's ROWS tokens reuse its loaded words; else a program per token. LAYOUT: LAYOUTS'
    index (0 a lane a block, 1 a lane a halfword, 2 a lane a block pair). PDL (kernels/pdl.py): the dense
    matvec's weights are loaded before the wait (no kernel of a step writes them); the routed form waits first
    (its expert ids come from the step's routing)."""
    pdl_start(PDL)
    if not SHARED:
        pdl_wait(PDL)
    STEP: tl.constexpr = 2 if LAYOUT == 2 else 1  # blocks a unit
    NB: tl.constexpr = K // 32
    UNITS: tl.constexpr = NB // STEP  # units a row of one expert
    ROW_BYTES: tl.constexpr = NB * 18
    first = tl.program_id(0) * (ROWS if SHARED else 1)
    rows = tl.program_id(1) * BN + tl.arange(0, BN)
    g = tl.arange(0, NU)
    j = g // UNITS
    blk = g % UNITS * STEP
    um = g < TOP_K * UNITS
    if SHARED:
        expert = tl.zeros_like(g)
    else:  # padding units (NU is a power of two) read the last expert's blocks again: cache hits, no HBM bytes
        expert = tl.load(ids + first * TOP_K + tl.minimum(j, TOP_K - 1)).to(tl.int32)
    w_at = w + expert.to(tl.int64)[:, None] * stride
    wts = _weights(w_at, (blk * 18)[:, None] + (tl.minimum(rows, N_OUT - 1) * ROW_BYTES)[None, :], LAYOUT)
    if SHARED:
        pdl_wait(PDL)
    for r in tl.static_range(ROWS if SHARED else 1):
        token = first + r
        pair = token * TOP_K + j
        if SHARED:
            weight = 1.0
        else:  # an expert's combine weight scales its blocks' d_x: one product a unit, not a row
            weight = tl.load(topk_w + pair, mask=um, other=0.0).to(tl.float32)
        out = _row_sums(wts, xq, xs, xsum, pair, blk, um, weight, K, LAYOUT)
        tl.store(y + token.to(tl.int64) * N_OUT + rows, out, mask=rows < N_OUT)


@triton.jit
def _dp4a_gate_up_kernel(xq, xs, xsum, ids, wg, wu, hid, stride_g, stride_u, N_OUT: tl.constexpr, K: tl.constexpr,
                         TOP_K: tl.constexpr, NU: tl.constexpr, BN: tl.constexpr, SWIGLU: tl.constexpr,
                         LAYOUT: tl.constexpr = 0, PDL: tl.constexpr = 0, codes=None, scales=None, sums=None,
                         QUANT: tl.constexpr = 0, STORE_H: tl.constexpr = 1):
    """Pair p = (token p // TOP_K, its expert ids[p]): hid[p, rows] = silu(gate rows . x) * (up rows . x), both
    operands' blocks loaded at once; without SWIGLU the two dots into hid[0, p, rows] and hid[1, p, rows]. PDL:
    the wait comes first (the ids are the step's routing). QUANT (SWIGLU, BN a multiple of 32, N_OUT too): the
    epilogue also rounds its H rows to int8 codes, scales and sums per 32 (quantize32's `round_groups`: the bytes
    of `quantize_x(hid)` in a launch without FMA contraction), the down kernel's input; STORE_H 0: no float H."""
    pdl_start(PDL)
    pdl_wait(PDL)
    STEP: tl.constexpr = 2 if LAYOUT == 2 else 1
    NB: tl.constexpr = K // 32
    ROW_BYTES: tl.constexpr = NB * 18
    pair = tl.program_id(0)
    rows = tl.program_id(1) * BN + tl.arange(0, BN)
    u = tl.arange(0, NU)
    um = u < NB // STEP
    blk = tl.minimum(u, NB // STEP - 1) * STEP
    expert = tl.load(ids + pair).to(tl.int64)
    off = (blk * 18)[:, None] + (tl.minimum(rows, N_OUT - 1) * ROW_BYTES)[None, :]
    g_wts = _weights(wg + expert * stride_g, off, LAYOUT)
    u_wts = _weights(wu + expert * stride_u, off, LAYOUT)
    token = pair // TOP_K + u * 0
    gate = _row_sums(g_wts, xq, xs, xsum, token, blk, um, 1.0, K, LAYOUT)
    up = _row_sums(u_wts, xq, xs, xsum, token, blk, um, 1.0, K, LAYOUT)
    at = hid + pair.to(tl.int64) * N_OUT + rows
    if SWIGLU:
        h = gate / (1.0 + tl.exp(-gate)) * up
        if STORE_H:
            tl.store(at, h, mask=rows < N_OUT)
        if QUANT:  # whole groups: rows past N_OUT fill only groups past it, which are not stored
            q, s, total = round_groups(tl.reshape(h, (1, BN)), 1, BN)
            tl.store(codes + pair.to(tl.int64) * N_OUT + rows[None, :], q, mask=rows[None, :] < N_OUT)
            groups = tl.program_id(1) * (BN // 32) + tl.arange(0, BN // 32)[None, :]
            at_g = pair.to(tl.int64) * (N_OUT // 32) + groups
            tl.store(scales + at_g, s, mask=groups < N_OUT // 32)
            tl.store(sums + at_g, total, mask=groups < N_OUT // 32)
    else:
        tl.store(at, gate, mask=rows < N_OUT)
        tl.store(at + tl.num_programs(0) * N_OUT, up, mask=rows < N_OUT)


def quantize_x(x: torch.Tensor, out=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, K] (K a multiple of 32) -> int8 codes [T, K], float32 scales [T, K/32], int32 code sums [T, K/32]:
    `quantize32`'s rounding (code = rint(x * 127 / a), a = max |x| of the 32), its Triton kernel on a GPU or under
    the interpreter, its torch reference on plain CPU runs."""
    if x.dim() != 2 or x.shape[-1] % GROUP:
        raise StrataError(f"dp4a GEMV: activation of shape {tuple(x.shape)} is not [rows, a multiple of {GROUP}]")
    if x.is_cuda or INTERPRETED:
        return quantize_rows_triton(x, out)
    return quantize_rows_ref(x, out)


def quantize_x_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The torch reference of `quantize_x`."""
    return quantize_rows_ref(x)


def row_error_bound(w64: torch.Tensor, x: torch.Tensor, xq, terms: int = 0) -> torch.Tensor:
    """[T, n_out] float64: the stated bound on |kernel - w64 . x[t]| for w64 [n_out, K] (the dequantized weights,
    float64), x [T, K] the ORIGINAL activation and xq its `quantize_x` triple, the kernel summing `terms` float32
    parts a row (default K / 4: one matrix, 8 parts a block as in the HALFWORDS layout; the other has 1). Each x_i
    is off its code by at most d_x / 2 + 4u|x_i| (the rounding and its float32 steps, u = 2^-24); the float32
    products and sums of n parts add at most (n + 4) u times sum |w| |x rounded| (the integer dots are exact)."""
    u = 2.0**-24
    codes, scales, _ = (t.to(w64.device) for t in xq)
    step = scales.double().repeat_interleave(GROUP, dim=1)  # [T, K]: each value's d_x
    x_err = step / 2 + 4 * u * x.to(w64.device).double().abs()
    rounded = codes.double() * step
    terms = terms or 8 * x.shape[1] // GROUP
    return x_err @ w64.abs().T + (terms + 4) * u * (rounded.abs() @ w64.abs().T)


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def dp4a_tile(n_out: int, n_units: int, programs: int, operands: int, on_gpu: bool,
              group: int = 1) -> tuple[int, int]:
    """(BN rows, warps) of a program over `n_units` blocks a row (all chosen experts' for the down form), n_out rows,
    `programs` programs a row tile (pairs or tokens), `operands` matrices (gate/up: 2).

    A thread holds at most LANE_BLOCKS block rows (the blocks layout: 9 uint16 loads each, all issued at once; sm_90
    builds: ~2 instructions a weight at 8, ~2.4 at 4, as fixed costs (addresses, the reduction) spread over fewer
    weights; the same bytes a thread in the other layouts),
    warps 4..16 to get there; rows start at 8 (more rows share each activation word) and halve while the grid gives
    under MIN_WARPS warps; `group` (a power of two): rows a multiple of it (the gate/up epilogue rounding H per 32
    rows: 32, however few programs; more blocks a thread where 16 warps do not reach LANE_BLOCKS). Under the
    interpreter (cost per operation): the widest tile, 4 warps."""
    if not on_gpu:
        return max(group, min(32, _pow2(n_out))), 4

    def fit(bn: int) -> tuple[int, int]:
        warps = 4
        while operands * _pow2(n_units) * bn / (32 * warps) > LANE_BLOCKS and warps < 16:
            warps *= 2
        return bn, warps

    bn, warps = fit(max(8, group))
    while bn > group and programs * -(-n_out // bn) * warps < MIN_WARPS:
        bn, warps = fit(bn // 2)
    return bn, warps


def _check(w: torch.Tensor, n_out: int, k: int, stride: int, layout: str | None) -> int:
    """LAYOUTS' index of `layout` (None: pairs where the weights allow it, else blocks), after one clear line for
    weights the kernels cannot read (expert ids are not checked: that would wait on the GPU)."""
    matrix = n_out * k // GROUP * BLOCK_BYTES
    if layout is None:  # pairs: ~20 % fewer instructions than blocks in sm_90 builds, half the load instructions
        layout = "pairs" if not (k % (2 * GROUP) or w.data_ptr() % 4 or stride % 4) else "blocks"
    if layout not in LAYOUTS:
        raise StrataError(f"dp4a GEMV: layout {layout!r} is not one of {', '.join(LAYOUTS)}")
    if k % GROUP:
        raise StrataError(f"dp4a GEMV: input width {k} is not a multiple of {GROUP} (whole Q4_0 blocks)")
    if w.dtype != torch.uint8 or not w.is_contiguous() or w.numel() < matrix or 0 < stride < matrix:
        raise StrataError(f"dp4a GEMV: weight bytes {tuple(w.shape)} {w.dtype} do not hold Q4_0 matrices of "
                          f"{n_out} x {k} ({matrix} bytes) at stride {stride}")
    if w.data_ptr() % 2:
        raise StrataError("dp4a GEMV: Q4_0 weight bytes must start at an even address (uint16 loads)")
    if layout == "pairs" and (k % (2 * GROUP) or w.data_ptr() % 4 or stride % 4):
        raise StrataError(f"dp4a GEMV: the pairs layout reads 4-aligned block pairs: input width {k} (a multiple of "
                          f"64?), weights at address {w.data_ptr()} and stride {stride} (multiples of 4?)")
    return LAYOUTS.index(layout)


def _units(layout: int, blocks: int) -> int:
    """NU: the power of two of lanes that holds `blocks` blocks as the layout (LAYOUTS' index) groups them."""
    return _pow2(blocks // 2 if LAYOUTS[layout] == "pairs" else blocks)


def dp4a_matvec(xq, w: torch.Tensor, n_out: int, y: torch.Tensor | None = None, bn: int | None = None,
                warps: int | None = None, layout: str | None = None, pdl: bool = False) -> torch.Tensor:
    """y [T, n_out] float32 (or y's dtype, given) = x [T, K] (T = 1..4 rows, given as `quantize_x`'s triple) times
    one Q4_0 matrix w (uint8, n_out rows of K / 32 blocks): the weights read once for all T rows. `pdl`: the launch
    takes STRATA_PDL's options (a decode step's)."""
    codes, scales, sums = xq
    n_tokens, k = codes.shape
    code = _check(w, n_out, k, 0, layout)
    d_bn, d_warps = dp4a_tile(n_out, k // 32, 1, 1, codes.is_cuda)
    bn, warps = bn or d_bn, warps or d_warps
    y = torch.empty(n_tokens, n_out, dtype=torch.float32, device=codes.device) if y is None else y
    _dp4a_down_kernel[(1, triton.cdiv(n_out, bn))](
        codes.view(torch.int32), scales, sums, codes, scales, w, y, 0, N_OUT=n_out, K=k, TOP_K=1,
        NU=_units(code, k // 32), BN=bn, ROWS=n_tokens, SHARED=True, LAYOUT=code, num_warps=warps,
        **(launch_options(codes) if pdl else {}))
    return y


def dp4a_down(hq, ids: torch.Tensor, weights: torch.Tensor, w: torch.Tensor, stride: int, n_out: int,
              y: torch.Tensor | None = None, bn: int | None = None, warps: int | None = None,
              layout: str | None = None, pdl: bool = False) -> torch.Tensor:
    """y [T, n_out] float32 (or y's dtype, given) = sum over j of weights[t, j] * (expert ids[t, j] of w . h[t * k + j]): the routed
    down projection, h [T * k, ff] given as `quantize_x`'s triple, experts at `stride` bytes in w."""
    codes, scales, sums = hq
    n_tokens, top_k = ids.shape
    k = codes.shape[1]
    code = _check(w, n_out, k, stride, layout)
    d_bn, d_warps = dp4a_tile(n_out, top_k * k // 32, n_tokens, 1, codes.is_cuda)
    bn, warps = bn or d_bn, warps or d_warps
    y = torch.empty(n_tokens, n_out, dtype=torch.float32, device=codes.device) if y is None else y
    _dp4a_down_kernel[(n_tokens, triton.cdiv(n_out, bn))](
        codes.view(torch.int32), scales, sums, ids.int().contiguous(), weights.float().contiguous(), w, y, stride,
        N_OUT=n_out, K=k, TOP_K=top_k, NU=_units(code, top_k * k // 32), BN=bn, ROWS=1, SHARED=False, LAYOUT=code,
        num_warps=warps, **(launch_options(codes) if pdl else {}))
    return y


def dp4a_gate_up(xq, ids: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor, stride: int, n_out: int,
                 swiglu: bool = True, bn: int | None = None, warps: int | None = None,
                 layout: str | None = None, pdl: bool = False, rounded: str = ""):
    """H [T * k, n_out] float32 = silu(gate . x[t]) * (up . x[t]) for each pair (t, ids[t, j]), gate and up Q4_0
    experts at `stride` bytes in wg / wu; without swiglu [2, T * k, n_out], the gate and the up dots.
    `rounded` (swiglu, n_out a multiple of 32; bn then one too): "codes" returns H's `quantize_x` triple written by
    the kernel's epilogue instead (no float H, no rounding launch: the down kernel's input), "both" (H, triple)."""
    codes, scales, sums = xq
    n_tokens, top_k = ids.shape
    k = codes.shape[1]
    code = min(_check(wg, n_out, k, stride, layout), _check(wu, n_out, k, stride, layout))  # (pairs only if both)
    if rounded not in ("", "codes", "both"):
        raise StrataError(f"dp4a GEMV: rounded={rounded!r} is not '', 'codes' or 'both'")
    group = GROUP if rounded else 1
    if rounded and (not swiglu or n_out % GROUP or (bn or GROUP) % GROUP):
        raise StrataError(f"dp4a GEMV: H rounded in the gate/up epilogue wants swiglu and whole groups of {GROUP}: "
                          f"{n_out} rows, tile {bn}")
    d_bn, d_warps = dp4a_tile(n_out, k // 32, n_tokens * top_k, 2, codes.is_cuda, group)
    bn, warps = bn or d_bn, warps or d_warps
    shape = (n_tokens * top_k, n_out) if swiglu else (2, n_tokens * top_k, n_out)
    keep_h = rounded != "codes"
    hid = torch.empty(shape if keep_h else (1,), dtype=torch.float32, device=codes.device)
    options = launch_options(codes) if pdl else {}
    if rounded:  # quantize32's bytes: no multiply-add contracted in the rounding (nor, so, in the dots before it)
        hq = rounded_rows_buffers(AllocatorScratch(codes.device), n_tokens * top_k, n_out)
        options = {**options, "codes": hq[0], "scales": hq[1], "sums": hq[2], "QUANT": 1, "STORE_H": int(keep_h),
                   "enable_fp_fusion": False}
    _dp4a_gate_up_kernel[(n_tokens * top_k, triton.cdiv(n_out, bn))](
        codes.view(torch.int32), scales, sums, ids.int().contiguous(), wg, wu, hid, stride, stride, N_OUT=n_out,
        K=k, TOP_K=top_k, NU=_units(code, k // 32), BN=bn, SWIGLU=swiglu, LAYOUT=code, num_warps=warps,
        **options)
    if not rounded:
        return hid
    return hq if rounded == "codes" else (hid, hq)

