"""The fused Q2_0 kernels' fp16 variant (`Tiles.fp16`, "h"): fp16 MMAs instead of int8 ones, no scaling per step.

The int8 kernels scale every 64-value step's two int32 dots in their epilogue: two int-to-float conversions, a
multiply and two fused multiply-adds per output per step, about 40 % of their loop's instructions on sm_90. Here
the MMA does that work: a Q2_0 weight is d * (code - 1) with d an fp16 and code - 1 in {-1, 0, 1, 2}, so the
weights decode EXACTLY to fp16 (one fp16 subtraction and one multiplication, no rounding), and the rows' rounded
activations (int8 code x scale, rounded once per token or per H row) are read as fp16 values, so one fp16 MMA with
float32 accumulation over the whole dot replaces the per-step epilogue. The cost: fp16 tensor cores run at half the
int8 rate (the kernels are far from either), the fp16 rounding of code x scale (2^-11 relative at most, 2^-12 rms;
the bounds of `bench moe-prefill` hold it), and fp16's range (|value| < 65504, as the dense fp16 path).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from strata.kernels.moe.decode import q2_0_words
from strata.kernels.moe.dispatch import use_triton
from strata.kernels.moe.quantize32 import GROUP

_CODE_BITS = tl.constexpr(0x64006400)  # fp16 1024.0 in both halves: OR-ing a code below 1024 gives 1024 + code


@triton.jit
def _half(bits):
    """The fp16 whose bits are the low 16 bits of an int32."""
    return bits.to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def _pair(pair, j: tl.constexpr, one, ds):
    """Weights j and j + 1 of each word (pair: word | word << 14) as fp16 d * (code - 1)."""
    bits = ((pair >> (2 * j)) & 0x00030003) | _CODE_BITS
    return (_half(bits) - one) * ds, (_half(bits >> 16) - one) * ds


@triton.jit
def q2_0_fp16_weights(words, d, NW: tl.constexpr):
    """int32 [NW, 4] code words of a 32-weight half (weight 8i + j in bits 2j of word i) and its scales d fp16 [NW]
    -> the weights d * (code - 1) as fp16 [NW, 32], exact. Two codes per 32-bit operation: word | word << 14 puts
    code j + 1 sixteen bits above code j, so one shift and one mask place both under fp16 1024's bits."""
    pair = words | (words << 14)
    one = tl.full((NW, 4), 1025.0, tl.float16)
    ds = d[:, None]
    w0, w1 = _pair(pair, 0, one, ds)
    w2, w3 = _pair(pair, 2, one, ds)
    w4, w5 = _pair(pair, 4, one, ds)
    w6, w7 = _pair(pair, 6, one, ds)
    # Joins of values 2^b apart, highest b first, give natural order (see decode.q2_0_codes).
    even = tl.join(tl.join(w0, w4), tl.join(w2, w6))
    odd = tl.join(tl.join(w1, w5), tl.join(w3, w7))
    return tl.reshape(tl.join(even, odd), (NW, 32))


@triton.jit
def _block_fp16(d, words0, words1, NW: tl.constexpr):
    """The 64 weights of one Q2_0 block of each of NW rows, fp16 [NW, 64] (both halves of `q2_0_words`)."""
    d16 = d.to(tl.float16)  # exact: d was an fp16
    w = tl.join(q2_0_fp16_weights(words0, d16, NW), q2_0_fp16_weights(words1, d16, NW))
    return tl.reshape(tl.permute(w, (0, 2, 1)), (NW, 64))


@triton.jit
def q2_0_fp16_loop(a, a_row, am, at, nm, K: tl.constexpr, TS: tl.constexpr, NW: tl.constexpr, BM: tl.constexpr,
                   WIDE: tl.constexpr):
    """float32 [BM, NW]: the dots of the NW Q2_0 weight rows whose blocks start at byte pointers `at` with the fp16
    rows a_row of `a` (K values each). Weight words are loaded one step ahead (registers double-buffer them).
    WIDE: two blocks a step (K a multiple of 128): half the barriers and MMA waits, twice the registers."""
    acc = tl.zeros((BM, NW), tl.float32)
    d, words0, words1 = q2_0_words(at, nm)
    if WIDE:
        e, words2, words3 = q2_0_words(at + TS, nm)
        for k0 in range(0, K, 128):
            # The next step's blocks (the last step reloads its own), at scalar offsets from the first block.
            nxt = tl.minimum(k0 + 128, K - 128) // 64
            nd, nwords0, nwords1 = q2_0_words(at + nxt * TS, nm)
            ne, nwords2, nwords3 = q2_0_words(at + (nxt + 1) * TS, nm)
            w = tl.join(_block_fp16(d, words0, words1, NW), _block_fp16(e, words2, words3, NW))
            w = tl.reshape(tl.permute(w, (0, 2, 1)), (NW, 128))
            x = tl.load(a + a_row[:, None] * K + k0 + tl.arange(0, 128)[None, :], mask=am[:, None], other=0.0)
            acc = tl.dot(x, tl.trans(w), acc)
            d, words0, words1, e, words2, words3 = nd, nwords0, nwords1, ne, nwords2, nwords3
    else:
        for k0 in range(0, K, 64):
            # The next step's block (the last step reloads its own), at a scalar offset from the first block.
            nd, nwords0, nwords1 = q2_0_words(at + (tl.minimum(k0 + 64, K - 64) // 64) * TS, nm)
            x = tl.load(a + a_row[:, None] * K + k0 + tl.arange(0, 64)[None, :], mask=am[:, None], other=0.0)
            acc = tl.dot(x, tl.trans(_block_fp16(d, words0, words1, NW)), acc)
            d, words0, words1 = nd, nwords0, nwords1
    return acc


@triton.jit
def _rounded_fp16_kernel(codes, scales, out, n_rows, K: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BK + tl.arange(0, BK)
    m = (rows[:, None] < n_rows) & (cols[None, :] < K)
    r64 = rows[:, None].to(tl.int64)
    q = tl.load(codes + r64 * K + cols[None, :], mask=m, other=0).to(tl.float32)
    s = tl.load(scales + r64 * (K // 32) + cols[None, :] // 32, mask=m, other=0.0)
    tl.store(out + r64 * K + cols[None, :], (q * s).to(tl.float16), mask=m)


def rounded_fp16(codes: torch.Tensor, scales: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The values int8 rows stand for (code x scale per 32 values, `quantize32`), rounded to fp16: fp16 [R, K]."""
    n_rows, k = codes.shape
    if out is None:
        out = torch.empty(n_rows, k, dtype=torch.float16, device=codes.device)
    if not use_triton(codes):
        return out.copy_((codes.float().reshape(n_rows, k // GROUP, GROUP) * scales[:, :, None]).reshape(n_rows, k))
    bm, bk = (16 if codes.is_cuda else 64), min(256, triton.next_power_of_2(k))
    if n_rows:
        _rounded_fp16_kernel[(triton.cdiv(n_rows, bm), triton.cdiv(k, bk))](codes, scales, out, n_rows, K=k, BM=bm,
                                                                           BK=bk)
    return out
