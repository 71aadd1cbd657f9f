"""The fused path's Q2_0 kernels: gate and up as one weight tile, and a wide down projection.

Why a kernel of its own: on Hopper each `tl.dot` of decoded weights stores them to shared memory, waits at a block
barrier, issues the wgmma and waits for it, because the int32 product is scaled at once (a scale per 32 values).
The first fused kernel issued four such dots per 64-value step (gate and up, two halves each) of 64 x 64 x 32,
all serialized. Here a program's weight tile is 2*BN rows, gate row f and up row f side by side (even and odd
columns), so a step is ONE dot for both projections: one barrier and one wait per step for 2*BN weight
rows, and each decoded weight reused by BM = 64 or 128 grouped rows (`Tiles.rows`). The dot is K = 64 against a
block-diagonal weight tile (column 2j: half 0 of row j over zeros, column 2j+1: zeros over half 1), so the two halves'
int32 sums come out side by side in each thread's registers: twice the int8 multiply-adds, which the tensor cores
have to spare, for half the synchronisation. ONE_DOT=False (`Tiles.split`) issues the two 32-value dots instead.

A 64-value step is two exact int32 dots scaled once: `acc = fma(d, fma(dx1, dot1, dx0 * dot0), acc)`, with explicit
fused multiply-adds so that no launch shape changes the arithmetic (the bytes are the same for every tile).
The down projection (`_down_q2_0_kernel`) is the same loop over BN weight rows of one matrix, stored as float32.
Variants (`Tiles` letters): MAGIC ("m") makes the int32 dots floats without conversions (the same bytes); FP16
("h") runs the loop of `fused_q2_0_fp16` instead (fp16 MMAs, no per-step scaling; H then stored as fp16 values);
HALF ("r"): a program whose tile holds no row past its half (an expert's last tile) runs the loop on BM / 2 rows.
"""

from __future__ import annotations

import triton
import triton.language as tl

from strata.kernels.moe.decode import q2_0_codes_words, q2_0_words
from strata.kernels.moe.fused_q2_0_fp16 import q2_0_fp16_loop
from strata.kernels.moe.quantize32 import round_groups

_MAGIC_BITS = tl.constexpr(0x4B400000)  # float32 1.5 * 2^23: an int32 added to its bits below 2^22 stays exact
_MAGIC_FLOAT = tl.constexpr(12582912.0)


@triton.jit
def _half_codes(a, a_row, am, k0, K: tl.constexpr):
    """The activation codes [BM, 32] of the two halves of the 64-step at k0 (loaded where the dots read them, so
    that Triton's pipeliner copies them ahead)."""
    at = a + a_row[:, None] * K + k0 + tl.arange(0, 32)[None, :]
    return tl.load(at, mask=am[:, None], other=0), tl.load(at + 32, mask=am[:, None], other=0)


@triton.jit
def _int_dot(x, w, BM: tl.constexpr, NW: tl.constexpr, MAGIC: tl.constexpr):
    """The exact int32 dot x [BM, K] . w [NW, K]^T as float32. MAGIC: the MMA starts from 1.5 * 2^23's bits, so
    its sum (|dot| < 2^22) is a float32's mantissa and one subtraction gives the float: no int-to-float conversion."""
    if MAGIC:
        start = tl.full((BM, w.shape[0]), _MAGIC_BITS, tl.int32)
        return tl.dot(x, tl.trans(w), start, out_dtype=tl.int32).to(tl.float32, bitcast=True) - _MAGIC_FLOAT
    else:
        return tl.dot(x, tl.trans(w)).to(tl.float32)


@triton.jit
def q2_0_wide_loop(a, a_scale, a_row, am, at, nm, K: tl.constexpr, TS: tl.constexpr, NW: tl.constexpr,
                   BM: tl.constexpr, ONE_DOT: tl.constexpr, MAGIC: tl.constexpr):
    """float32 [BM, NW]: the dots of the NW Q2_0 weight rows whose blocks start at byte pointers `at` with the
    int8 rows a_row. Weight words are loaded one step ahead (registers double-buffer them)."""
    acc = tl.zeros((BM, NW), tl.float32)
    d, words0, words1 = q2_0_words(at, nm)
    for k0 in range(0, K, 64):
        # The next step's block (the last step reloads its own): a scalar offset from the first block, so that no
        # pointer is carried through the loop (64-bit adds per element).
        nd, nwords0, nwords1 = q2_0_words(at + (tl.minimum(k0 + 64, K - 64) // 64) * TS, nm)
        q0 = q2_0_codes_words(words0, NW)
        q1 = q2_0_codes_words(words1, NW)
        if not ONE_DOT:
            xc0, xc1 = _half_codes(a, a_row, am, k0, K)
        group = a_row * (K // 32) + k0 // 32
        dx0 = tl.load(a_scale + group, mask=am, other=0.0)
        dx1 = tl.load(a_scale + group + 1, mask=am, other=0.0)
        if ONE_DOT:
            z = tl.zeros_like(q0)
            top = tl.reshape(tl.permute(tl.join(q0, z), (0, 2, 1)), (NW, 64))
            bot = tl.reshape(tl.permute(tl.join(z, q1), (0, 2, 1)), (NW, 64))
            wt = tl.reshape(tl.permute(tl.join(top, bot), (0, 2, 1)), (2 * NW, 64))
            xc = tl.load(a + a_row[:, None] * K + k0 + tl.arange(0, 64)[None, :], mask=am[:, None], other=0)
            dot0, dot1 = tl.split(tl.reshape(_int_dot(xc, wt, BM, 2 * NW, MAGIC), (BM, NW, 2)))
        else:
            dot0 = _int_dot(xc0, q0, BM, NW, MAGIC)
            dot1 = _int_dot(xc1, q1, BM, NW, MAGIC)
        acc = tl.fma(d[None, :], tl.fma(dx1[:, None], dot1, dx0[:, None] * dot0), acc)
        d, words0, words1 = nd, nwords0, nwords1
    return acc


@triton.jit
def _tile_rows(row_token, tile_expert, tile, BM: tl.constexpr, RUN: tl.constexpr):
    """The tile's expert, its first RUN rows (of BM) and their tokens (-1: padding)."""
    expert = tl.load(tile_expert + tile).to(tl.int64)
    rows = tile * BM + tl.arange(0, RUN)
    token = tl.load(row_token + rows)
    return expert, rows, token


@triton.jit
def _is_half_empty(row_token, tile, BM: tl.constexpr):
    """Whether the tile's rows past its first half are padding (an expert's rows come first in its last tile)."""
    return tl.load(row_token + tile * BM + BM // 2) < 0


@triton.jit
def _gate_up_q2_0_kernel(a, a_scale, row_token, tile_expert, n_tiles, wg, wu, hq, hs, hsum,
                         n_ff, expert_bytes, row_bytes,
                         K: tl.constexpr, TS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                         ONE_DOT: tl.constexpr, MAGIC: tl.constexpr, FP16: tl.constexpr, WIDE: tl.constexpr,
                         H16: tl.constexpr, HALF: tl.constexpr):
    """FP16: `a` holds the tokens' rounded activations as fp16 (`fused_q2_0_fp16`), a_scale unused. H16: H is
    stored as fp16 values (code x scale) in hq, for the fp16 down kernel; hs and hsum unwritten. HALF: a tile
    whose second half is padding computes BM / 2 rows."""
    pid = tl.program_id(0)
    n_blocks = tl.cdiv(n_ff, BN)
    tile = pid // n_blocks
    if tile >= tl.load(n_tiles):
        return
    if HALF:
        if _is_half_empty(row_token, tile, BM):
            _gate_up_tile(a, a_scale, row_token, tile_expert, tile, pid % n_blocks, wg, wu, hq, hs, hsum, n_ff,
                          expert_bytes, row_bytes, K, TS, BM, BM // 2, BN, ONE_DOT, MAGIC, FP16, WIDE, H16)
            return
    _gate_up_tile(a, a_scale, row_token, tile_expert, tile, pid % n_blocks, wg, wu, hq, hs, hsum, n_ff,
                  expert_bytes, row_bytes, K, TS, BM, BM, BN, ONE_DOT, MAGIC, FP16, WIDE, H16)


@triton.jit
def _gate_up_tile(a, a_scale, row_token, tile_expert, tile, block, wg, wu, hq, hs, hsum, n_ff, expert_bytes,
                  row_bytes, K: tl.constexpr, TS: tl.constexpr, BM: tl.constexpr, RUN: tl.constexpr,
                  BN: tl.constexpr, ONE_DOT: tl.constexpr, MAGIC: tl.constexpr, FP16: tl.constexpr,
                  WIDE: tl.constexpr, H16: tl.constexpr):
    """One program's work: RUN rows of the tile by BN features (gate and up side by side), H rounded and stored."""
    expert, rows, token = _tile_rows(row_token, tile_expert, tile, BM, RUN)
    am = token >= 0
    a_row = tl.where(am, token, 0).to(tl.int64)
    c = tl.arange(0, 2 * BN)
    f = block * BN + c // 2  # column 2i: gate row f0 + i; column 2i + 1: up row f0 + i
    fm = f < n_ff
    offset = expert * expert_bytes + f * row_bytes
    at = tl.where(c % 2 == 0, wg + offset, wu + offset)
    if FP16:
        acc = q2_0_fp16_loop(a, a_row, am, at, fm, K, TS, 2 * BN, RUN, WIDE)
    else:
        acc = q2_0_wide_loop(a, a_scale, a_row, am, at, fm, K, TS, 2 * BN, RUN, ONE_DOT, MAGIC)
    g, u = tl.split(tl.reshape(acc, (RUN, BN, 2)))
    h = g / (1.0 + tl.exp(-g)) * u
    codes, scales, sums = round_groups(h, RUN, BN)
    fo = block * BN + tl.arange(0, BN)
    r64 = rows.to(tl.int64)[:, None]
    if H16:
        values = tl.reshape(tl.reshape(codes.to(tl.float32), (RUN, BN // 32, 32)) * scales[:, :, None], (RUN, BN))
        tl.store(hq + r64 * n_ff + fo[None, :], values.to(tl.float16), mask=am[:, None] & (fo < n_ff)[None, :])
    else:
        tl.store(hq + r64 * n_ff + fo[None, :], codes, mask=am[:, None] & (fo < n_ff)[None, :])
        gi = block * (BN // 32) + tl.arange(0, BN // 32)
        gm = am[:, None] & (gi[None, :] < n_ff // 32)
        tl.store(hs + r64 * (n_ff // 32) + gi[None, :], scales, mask=gm)
        tl.store(hsum + r64 * (n_ff // 32) + gi[None, :], sums, mask=gm)


@triton.jit
def _down_q2_0_kernel(h, h_scale, row_token, tile_expert, n_tiles, w, out, n_out, expert_bytes, row_bytes,
                      K: tl.constexpr, TS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, ONE_DOT: tl.constexpr,
                      MAGIC: tl.constexpr, FP16: tl.constexpr, WIDE: tl.constexpr, HALF: tl.constexpr):
    """FP16: `h` holds H as fp16 values (the gate/up kernel's H16), h_scale unused. HALF: as the gate/up kernel's."""
    pid = tl.program_id(0)
    n_blocks = tl.cdiv(n_out, BN)
    tile = pid // n_blocks
    if tile >= tl.load(n_tiles):
        return
    if HALF:
        if _is_half_empty(row_token, tile, BM):
            _down_tile(h, h_scale, row_token, tile_expert, tile, pid % n_blocks, w, out, n_out, expert_bytes,
                       row_bytes, K, TS, BM, BM // 2, BN, ONE_DOT, MAGIC, FP16, WIDE)
            return
    _down_tile(h, h_scale, row_token, tile_expert, tile, pid % n_blocks, w, out, n_out, expert_bytes, row_bytes,
               K, TS, BM, BM, BN, ONE_DOT, MAGIC, FP16, WIDE)


@triton.jit
def _down_tile(h, h_scale, row_token, tile_expert, tile, block, w, out, n_out, expert_bytes, row_bytes,
               K: tl.constexpr, TS: tl.constexpr, BM: tl.constexpr, RUN: tl.constexpr, BN: tl.constexpr,
               ONE_DOT: tl.constexpr, MAGIC: tl.constexpr, FP16: tl.constexpr, WIDE: tl.constexpr):
    """One program's work: RUN rows of the tile by BN outputs, stored as `out`'s type (float32, or fp16)."""
    expert, rows, token = _tile_rows(row_token, tile_expert, tile, BM, RUN)
    am = token >= 0
    r64 = rows.to(tl.int64)
    n = block * BN + tl.arange(0, BN)
    nm = n < n_out
    at = w + expert * expert_bytes + n * row_bytes
    if FP16:
        acc = q2_0_fp16_loop(h, r64, am, at, nm, K, TS, BN, RUN, WIDE)
    else:
        acc = q2_0_wide_loop(h, h_scale, r64, am, at, nm, K, TS, BN, RUN, ONE_DOT, MAGIC)
    tl.store(out + r64[:, None] * n_out + n[None, :], acc.to(out.dtype.element_ty), mask=am[:, None] & nm[None, :])
