"""Wide loads of GGUF blocks for the decode GEMV kernels: 32 weights of a block from a few 16- or 32-bit words.

`decode32` (decode.py) reads a byte per decoded weight: every weight costs a load instruction and an int-to-float
conversion (a quarter-rate instruction on Hopper), which caps the GEMV kernels far below HBM bandwidth.
`wide_weights32` reads the packed codes as words and unpacks them with shifts and masks in registers:

  * Q4_0 (18-byte blocks) and Q8_0 (34-byte blocks) are only 2-byte aligned: their codes are read as 8 (Q4_0) or
    16 (Q8_0) uint16 words per 32 weights, 4 or 2 weights a word (the width llama.cpp's CUDA kernels use for them).
  * Q4_K (144-byte blocks, 4-byte aligned) reads a 32-weight slice as 8 contiguous uint32 words, which the compiler
    turns into 128-bit loads.

The codes become float32 without a conversion instruction: `code | 0x4B000000` read as a float is 2^23 + code
exactly (code < 2^23), so one subtraction gives the code minus its offset, exactly. The weights returned are the same
float32 values `decode32` + `_weights` give (same products, same single rounding), so the kernels' float64 bound is
unchanged. The word shapes are broadcast against shift tensors and reshaped to [R, 32] in the natural weight order,
so the kernels' activation tiles need no permutation.

`wide_aligned` says whether an operand may take these loads: the formats above, with every block start 2-byte
(Q4_0, Q8_0) or 4-byte (Q4_K) aligned; other formats and odd layouts keep `decode32`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from strata.kernels.moe.decode import DecodeSpec

# Bytes of alignment the wide loads need per format (every block start must be a multiple).
WIDE_ALIGN = {"Q4_0": 2, "Q8_0": 2, "Q4_K": 4}

_MAGIC = tl.constexpr(0x4B000000)  # the float32 bits of 2^23: OR-ing a code below 2^23 into the mantissa gives 2^23 + code
_TWO23 = tl.constexpr(8388608.0)


def wide_aligned(spec: DecodeSpec, *byte_offsets: int) -> bool:
    """Whether the wide loads apply: a format they read, and every given offset (the operand's data pointer, its
    expert stride, its row bytes) a multiple of the format's word size."""
    align = WIDE_ALIGN.get(spec.name)
    return align is not None and all(offset % align == 0 for offset in byte_offsets)


@triton.jit
def _code_float(code, offset: tl.constexpr):
    """code (uint32, < 2^23) minus `offset`, as an exact float32, without an int-to-float conversion."""
    return (code | _MAGIC).to(tl.float32, bitcast=True) - (_TWO23 + offset)


@triton.jit
def _fp16_at(h16, at, mask):
    return tl.load(h16 + at, mask=mask, other=0).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def wide_weights32(FMT: tl.constexpr, w, blk, sub, nm):
    """The float32 weights [R, 32] of weights [sub*32, sub*32 + 32) of the blocks at byte offsets blk [R] of w
    (a uint8 pointer), for FMT 1 (Q4_0), 2 (Q8_0) or 10 (Q4_K); rows where nm is False give 0."""
    m = nm[:, None]
    if FMT == 1:  # Q4_0: fp16 d, then 16 bytes: byte t's low nibble is weight t, its high nibble weight t + 16
        h16 = w.to(tl.pointer_type(tl.uint16))
        first = blk // 2  # in halfwords
        d = _fp16_at(h16, first, nm)
        t = tl.arange(0, 8)
        words = tl.load(h16 + (first + 1)[:, None] + t[None, :], mask=m, other=0).to(tl.uint32)  # [R, 8]
        nibble = tl.arange(0, 2)[None, :, None, None].to(tl.uint32)  # [1, 2, 1, 1]: low / high nibble
        byte = tl.arange(0, 2)[None, None, None, :].to(tl.uint32)  # [1, 1, 1, 2]: byte of the halfword
        code = (words[:, None, :, None] >> (4 * nibble + 8 * byte)) & 15  # [R, 2, 8, 2]: weight 16*n + 2*t + b
        q = _code_float(tl.reshape(code, (blk.shape[0], 32)), 8.0)
        return q * d[:, None]
    elif FMT == 2:  # Q8_0: fp16 d, then 32 int8 codes
        h16 = w.to(tl.pointer_type(tl.uint16))
        first = blk // 2
        d = _fp16_at(h16, first, nm)
        t = tl.arange(0, 16)
        words = tl.load(h16 + (first + 1)[:, None] + t[None, :], mask=m, other=0).to(tl.uint32)  # [R, 16]
        byte = tl.arange(0, 2)[None, None, :].to(tl.uint32)
        code = ((words[:, :, None] >> (8 * byte)) & 255) ^ 128  # [R, 16, 2]: weight 2*t + b, as q + 128
        q = _code_float(tl.reshape(code, (blk.shape[0], 32)), 128.0)
        return q * d[:, None]
    else:  # Q4_K: d, dmin, 12 bytes of 6-bit scales and mins, then 4 chunks of 32 bytes (low nibbles: sub 2c)
        block = w + blk
        a = tl.load(block + 4 + sub, mask=nm, other=0).to(tl.int32)
        c = tl.load(block + 8 + sub, mask=nm, other=0).to(tl.int32)
        e = tl.load(block + sub, mask=nm, other=0).to(tl.int32)
        scale = tl.where(sub < 4, a & 63, (c & 15) | ((e >> 2) & 48))
        mins = tl.where(sub < 4, c & 63, (c >> 4) | ((a >> 2) & 48))
        h16 = w.to(tl.pointer_type(tl.uint16))
        s = _fp16_at(h16, blk // 2, nm) * scale.to(tl.float32)
        mn = -(_fp16_at(h16, blk // 2 + 1, nm) * mins.to(tl.float32))
        w32 = w.to(tl.pointer_type(tl.uint32))
        i = tl.arange(0, 8)
        words = tl.load(w32 + ((blk + 16 + 32 * (sub // 2)) // 4)[:, None] + i[None, :], mask=m, other=0)  # [R, 8]
        byte = tl.arange(0, 4)[None, None, :].to(tl.uint32)
        code = (words.to(tl.uint32)[:, :, None] >> (8 * byte + 4 * (sub % 2))) & 15  # [R, 8, 4]: weight 4*i + b
        q = _code_float(tl.reshape(code, (blk.shape[0], 32)), 0.0)
        return q * s[:, None] + mn[:, None]


@triton.jit
def _wide_dequantize_kernel(w, out, n_rows, row_bytes, K: tl.constexpr, FMT: tl.constexpr, QK: tl.constexpr,
                            TS: tl.constexpr, BN: tl.constexpr):
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    nm = rows < n_rows
    j = tl.arange(0, 32)
    for k in range(0, K, 32):
        blk = rows.to(tl.int64) * row_bytes + (k // QK) * TS
        value = wide_weights32(FMT, w, blk, (k % QK) // 32, nm)
        tl.store(out + rows[:, None].to(tl.int64) * K + k + j[None, :], value, mask=nm[:, None])


def wide_dequantize_rows(raw, spec: DecodeSpec, shape: tuple[int, int], rows_per_program: int = 16):
    """The weights of raw uint8 [rows, row_bytes] as float32 [rows, cols], through `wide_weights32` alone (the
    tests hold it to `strata.quant.dequantize`, bit for bit)."""
    import torch

    rows, cols = shape
    out = torch.empty(rows, cols, dtype=torch.float32, device=raw.device)
    _wide_dequantize_kernel[(triton.cdiv(rows, rows_per_program),)](
        raw, out, rows, raw.shape[-1], cols, FMT=spec.fmt_id, QK=spec.block_size, TS=spec.type_size,
        BN=rows_per_program)
    return out
