"""Register-level pieces the word GEMV kernels share (`wide_gemv.py`, `grid_words.py`): exact codes from packed
words without a conversion instruction, and activations loaded whole and split in registers."""

import triton
import triton.language as tl

_MAGIC = tl.constexpr(0x4B000000)  # float32 2^23: OR-ing a code below 2^23 into its mantissa gives 2^23 + code
_TWO23 = tl.constexpr(8388608.0)


@triton.jit
def codes(word, shift: tl.constexpr, mask: tl.constexpr, offset: tl.constexpr):
    """((word >> shift) & mask) - offset as exact float32 (code | 2^23's bits, minus 2^23 + offset)."""
    return (((word >> shift) & mask) | _MAGIC).to(tl.float32, bitcast=True) - (_TWO23 + offset)


@triton.jit
def pairs(x_at, t, um):
    """The activations at x_at[u] + 2t and the next ones, float32 [NU, NT] each, from one load of adjacent pairs
    split in registers. The load is [NT, NU, 2] and transposed after: Triton then gives it the words' lanes (t
    fastest, then units), so no layout conversion goes through shared memory."""
    at = x_at[None, :, None] + 2 * t[:, None, None] + tl.arange(0, 2)[None, None, :]
    pair = tl.load(at, mask=um[None, :, None], other=0.0).to(tl.float32)
    lo, hi = tl.split(pair)
    return tl.trans(lo), tl.trans(hi)


@triton.jit
def quads(x_at, t, um):
    """The activations x_at[u] + 4t + k, k = 0..3, float32 [NU, NT] each, from one load (as `pairs`)."""
    at = x_at[None, :, None] + 4 * t[:, None, None] + tl.arange(0, 4)[None, None, :]
    quad = tl.load(at, mask=um[None, :, None], other=0.0).to(tl.float32)
    even, odd = tl.split(tl.reshape(quad, (quad.shape[0], quad.shape[1], 2, 2)))  # k = 0, 2 and k = 1, 3
    x0, x2 = tl.split(even)
    x1, x3 = tl.split(odd)
    return tl.trans(x0), tl.trans(x1), tl.trans(x2), tl.trans(x3)
