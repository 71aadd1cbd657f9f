"""One step of the streamed GEMV kernels (`stream_gemv.py`), split in its loads and its arithmetic so that a kernel
can issue step s + 1's loads before it multiplies step s: `fetch_words` / `fetch_x` only load (nothing consumes the
values, so nothing waits for them), `step_dot` only computes.

The arithmetic is `wide_gemv._unit_dot`'s with fewer instructions a weight. A field (word >> s) & m becomes a float
as the word kernels do (its bits ORed into 2^23's mantissa, minus 2^23 and the offset), but in place: 2^23's bits
are ORed into the 16-bit word once, and then wm & (exponent bits | m << s), one LOP3, reads 2^23 + field * 2^s,
exact while m << s stays below 2^23; a field costs LOP3 + FADD instead of SHF + SGXT + LOP3 + FADD, and the
activation it multiplies comes scaled by 2^-s (one FMUL an activation, shared by every row and by gate and up). Both
scalings are by powers of two, so each product, and with the word kernels' order each sum, is bit for bit theirs
(away from float32's subnormal range)."""

from __future__ import annotations

import triton
import triton.language as tl

_MAGIC = tl.constexpr(0x4B000000)  # float32 2^23
_TWO23 = tl.constexpr(8388608.0)


_EXPONENT = tl.constexpr(0x7F800000)


@triton.jit
def _field(wm, SHIFT: tl.constexpr, MASK: tl.constexpr, OFFSET: tl.constexpr):
    """(((word >> SHIFT) & MASK) - OFFSET) * 2^SHIFT as an exact float32, from wm = word | 2^23's bits (word < 2^16):
    the field and the exponent kept in place (one LOP3), minus 2^23 + OFFSET * 2^SHIFT."""
    return (wm & (_EXPONENT | (MASK << SHIFT))).to(tl.float32, bitcast=True) - (_TWO23 + OFFSET * (1 << SHIFT))


@triton.jit
def _x_run(x_at, t, um, STRIDE: tl.constexpr, WIDTH: tl.constexpr, OFFSET: tl.constexpr):
    """Activations x_at[u] + OFFSET + STRIDE*t + (0..WIDTH-1) as one load [NT, NU, WIDTH] in the words' lane order
    (as word_loads.pairs: t fastest, then units), converted and split in registers by `step_dot`."""
    at = x_at[None, :, None] + OFFSET + STRIDE * t[:, None, None] + tl.arange(0, WIDTH)[None, None, :]
    return tl.load(at, mask=um[None, :, None], other=0.0)


@triton.jit
def _halves(v):
    """[NT, NU, 2] -> its two [NU, NT] halves, float32."""
    lo, hi = tl.split(v.to(tl.float32))
    return tl.trans(lo), tl.trans(hi)


@triton.jit
def _quarters(v):
    """[NT, NU, 4] -> elements 0..3 as [NU, NT] each, float32."""
    even, odd = tl.split(tl.reshape(v.to(tl.float32), (v.shape[0], v.shape[1], 2, 2)))  # k = 0, 2 and k = 1, 3
    x0, x2 = tl.split(even)
    x1, x3 = tl.split(odd)
    return tl.trans(x0), tl.trans(x1), tl.trans(x2), tl.trans(x3)


@triton.jit
def fetch_words(FMT: tl.constexpr, w_at, off, blk, t, bm):
    """The loads of units blk [NU] whose blocks start `off` [NU, BN] (int32) bytes after w_at (the expert's first
    byte: a pointer, or [NU, 1] of them), bm: the units to read. Returns the code words [NU, BN, NT] and the scale
    fields [NU, BN] four times. Q2_0 / Q4_0 / Q8_0: uint16 words after the block's fp16 scale bits (then the same
    scale three times more: nothing more is loaded); Q4_K (unit = slice pair p = blk % 4 of the super-block at
    `off`): uint32 words, then d | dmin << 16 and the halfwords holding the 6-bit scale bytes at 4 + 2p, 8 + 2p and
    2p (`wide_gemv._unit_dot` reads the same bytes one by one)."""
    h16 = w_at.to(tl.pointer_type(tl.uint16))
    if FMT == 10:
        pair = (blk % 4)[:, None]
        w32 = w_at.to(tl.pointer_type(tl.uint32))
        words_at = w32 + ((off + 16 + 32 * pair) >> 2)  # [NU, BN]: whatever w_at's shape
        word = tl.load(words_at[:, :, None] + t[None, None, :], mask=bm[:, :, None], other=0)
        dd = tl.load(w32 + (off >> 2), mask=bm, other=0)
        a = tl.load(h16 + ((off + 4 + 2 * pair) >> 1), mask=bm, other=0)
        c = tl.load(h16 + ((off + 8 + 2 * pair) >> 1), mask=bm, other=0)
        e = tl.load(h16 + ((off + 2 * pair) >> 1), mask=bm, other=0)
    else:
        first = h16 + (off >> 1)  # [NU, BN]: whatever w_at's shape
        word = tl.load(first[:, :, None] + 1 + t[None, None, :], mask=bm[:, :, None], other=0)
        dd = tl.load(first, mask=bm, other=0)
        a = dd
        c = dd
        e = dd
    return word, dd, a, c, e


@triton.jit
def fetch_x(FMT: tl.constexpr, x_at, t, um):
    """The activations of each word as loaded ([NT, NU, 4 or 2], twice): Q2_0 weights 8t..8t+3 and 8t+4..8t+7, Q4_K
    4t..4t+3 of both 32-weight halves, Q4_0 2t, 2t+1 and 2t+16, 2t+17, Q8_0 2t, 2t+1 (the second the first again)."""
    if FMT == 0:
        xa = _x_run(x_at, t, um, 8, 4, 0)
        xb = _x_run(x_at, t, um, 8, 4, 4)
    elif FMT == 10:
        xa = _x_run(x_at, t, um, 4, 4, 0)
        xb = _x_run(x_at, t, um, 4, 4, 32)
    elif FMT == 1:
        xa = _x_run(x_at, t, um, 2, 2, 0)
        xb = _x_run(x_at, t, um, 2, 2, 16)
    else:
        xa = _x_run(x_at, t, um, 2, 2, 0)
        xb = xa
    return xa, xb


@triton.jit
def step_dot(FMT: tl.constexpr, word, s0, s1, s2, s3, xa, xb, blk):
    """The scaled partial dots [NU, BN, NT] of a fetched step (units blk [NU]): `wide_gemv._unit_dot`'s sums, in
    its order."""
    if FMT == 10:
        s = _q4_k_dot(word.to(tl.uint32), s0, s1, s2, s3, xa, xb, blk % 4)
    else:
        s = _block_dot(FMT, word.to(tl.uint32) | _MAGIC, xa, xb) \
            * s0.to(tl.float16, bitcast=True).to(tl.float32)[:, :, None]
    return s


@triton.jit
def _block_dot(FMT: tl.constexpr, word, xa, xb):
    """Q2_0 / Q4_0 / Q8_0: the unscaled dots [NU, BN, NT] of each word's codes with their activations (word: the
    uint16 code word | 2^23's bits)."""
    if FMT == 0:  # Q2_0: halfword t holds weights 8t..8t+7, two bits each, weight = d * (code - 1)
        x0, x1, x2, x3 = _quarters(xa)
        s = _field(word, 0, 3, 1.0) * x0[:, None, :] + _field(word, 2, 3, 1.0) * (x1 * 0.25)[:, None, :]
        s += (_field(word, 4, 3, 1.0) * (x2 * 0.0625)[:, None, :]
              + _field(word, 6, 3, 1.0) * (x3 * 0.015625)[:, None, :])
        x0, x1, x2, x3 = _quarters(xb)
        s += (_field(word, 8, 3, 1.0) * (x0 * 0.00390625)[:, None, :]
              + _field(word, 10, 3, 1.0) * (x1 * 0.0009765625)[:, None, :])
        s += (_field(word, 12, 3, 1.0) * (x2 * 0.000244140625)[:, None, :]
              + _field(word, 14, 3, 1.0) * (x3 * 0.00006103515625)[:, None, :])
    elif FMT == 1:  # Q4_0: weights 2t, 2t+1 (low nibbles of the word's bytes) and 2t+16, 2t+17 (high)
        x0, x1 = _halves(xa)
        x16, x17 = _halves(xb)
        s = _field(word, 0, 15, 8.0) * x0[:, None, :]
        s += _field(word, 8, 15, 8.0) * (x1 * 0.00390625)[:, None, :]
        s += _field(word, 4, 15, 8.0) * (x16 * 0.0625)[:, None, :]
        s += _field(word, 12, 15, 8.0) * (x17 * 0.000244140625)[:, None, :]
    else:  # Q8_0: int8 codes 2t, 2t+1, read as q + 128 (the bytes' top bits flipped)
        x0, x1 = _halves(xa)
        word = word ^ 0x8080  # (2^23's bits untouched)
        s = _field(word, 0, 255, 128.0) * x0[:, None, :]
        s += _field(word, 8, 255, 128.0) * (x1 * 0.00390625)[:, None, :]
    return s


@triton.jit
def _q4_k_dot(word, dd, a, c, e, xa, xb, pair):
    """Q4_K's slice-pair dots: word t holds weights 4t..4t+3 of both halves (low, high nibbles); per 32-weight
    half d*sc * sum q x - dmin*m * sum x, sc and m the 6-bit fields of sub-blocks 2p, 2p + 1. The word's halves
    each get 2^23's bits (the top one shifted down: its fields would reach the exponent in place)."""
    top = (word >> 16) | _MAGIC
    word = (word & 0xFFFF) | _MAGIC
    x0, x1, x2, x3 = _quarters(xa)
    dot_lo = _field(word, 0, 15, 0.0) * x0[:, None, :] + _field(word, 8, 15, 0.0) * (x1 * 0.00390625)[:, None, :]
    dot_lo += _field(top, 0, 15, 0.0) * x2[:, None, :] + _field(top, 8, 15, 0.0) * (x3 * 0.00390625)[:, None, :]
    sum_lo = (x0 + x1) + (x2 + x3)
    x0, x1, x2, x3 = _quarters(xb)
    dot_hi = (_field(word, 4, 15, 0.0) * (x0 * 0.0625)[:, None, :]
              + _field(word, 12, 15, 0.0) * (x1 * 0.000244140625)[:, None, :])
    dot_hi += (_field(top, 4, 15, 0.0) * (x2 * 0.0625)[:, None, :]
               + _field(top, 12, 15, 0.0) * (x3 * 0.000244140625)[:, None, :])
    sum_hi = (x0 + x1) + (x2 + x3)
    a = a.to(tl.int32)
    c = c.to(tl.int32)
    e = e.to(tl.int32)
    a0, a1, c0, c1, e0, e1 = a & 255, a >> 8, c & 255, c >> 8, e & 255, e >> 8
    low = pair[:, None] < 2  # sub-blocks 0..3 keep their 6 bits in place; 4..7 split them
    sc0 = tl.where(low, a0 & 63, (c0 & 15) | ((e0 >> 2) & 48)).to(tl.float32)
    sc1 = tl.where(low, a1 & 63, (c1 & 15) | ((e1 >> 2) & 48)).to(tl.float32)
    mn0 = tl.where(low, c0 & 63, (c0 >> 4) | ((a0 >> 2) & 48)).to(tl.float32)
    mn1 = tl.where(low, c1 & 63, (c1 >> 4) | ((a1 >> 2) & 48)).to(tl.float32)
    d = (dd & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    dmin = (dd >> 16).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    part = dot_lo * (d * sc0)[:, :, None] + dot_hi * (d * sc1)[:, :, None]
    return part - (dmin * mn0)[:, :, None] * sum_lo[:, None, :] - (dmin * mn1)[:, :, None] * sum_hi[:, None, :]
