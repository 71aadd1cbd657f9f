"""The word kernels' unit dots for the lattice i-quants IQ2_XS, IQ3_XXS and IQ3_S (`wide_gemv.py` calls them).

A unit is a 32-weight sub-block of a 256-weight super-block, a word the uint16 that one thread loads for 8 of its
weights: IQ2_XS's 9-bit grid index and 7-bit sign index; IQ3_XXS's and IQ3_S's two grid bytes (4 weights each; IQ3_S
takes a 9th index bit per byte from qh). A grid entry is read whole from a packed table (`grid_word_tables`: one
uint64 of 8 byte-sized values per IQ2_XS entry, one uint32 of 4 per IQ3 entry), so each weight costs a shift and a
mask of the entry instead of a byte gather; the 8 signs of a word come as one byte (IQ3_S stores it; IQ2_XS and
IQ3_XXS store a 7-bit index whose 8th bit is the parity, read from a 128-entry table of whole sign bytes) and
flip the float's sign bit. Values become floats exactly as in `wide_gemv` (code | 2^23's bits, minus 2^23).

Scales (all exact in float32 once multiplied, as in `strata.quant.iquants`): IQ2_XS d*(0.5 + s)*0.25 with a 4-bit
s per 16 weights (two words), IQ3_XXS d*(0.5 + s)*0.5 with s the top 4 bits of the sub-block's uint32 of sign
indices, IQ3_S d*(1 + 2s) with a 4-bit s per sub-block.
"""

from __future__ import annotations

import numpy as np
import triton
import triton.language as tl

from strata.kernels.moe.word_loads import codes, quads
from strata.quant.tables import grid_values, sign_patterns

GRID_FORMATS = {"IQ2_XS", "IQ3_XXS", "IQ3_S"}

WORD_TABLES_AT = tl.constexpr(18448)  # the byte where these tables start inside decode.code_tables (8-aligned)
# Offsets in int32 entries of their sections (constexpr: the kernels read them).
_SIGN_BYTES, _IQ2_XS, _IQ3_XXS, _IQ3_S = tl.constexpr(0), tl.constexpr(128), tl.constexpr(1152), tl.constexpr(1408)


def _packed(values: np.ndarray) -> np.ndarray:
    """Grid rows of byte-sized values [entries, w] as little-endian words: value i in bits 8i..8i+7."""
    v = values.astype(np.uint64)
    return sum(v[:, i] << np.uint64(8 * i) for i in range(v.shape[1]))


def word_table_bytes() -> np.ndarray:
    """int32 [1920] as int8 bytes: the 128 sign bytes (7 stored bits + parity), IQ2_XS's 512 grid entries as uint64
    (pairs of int32, 8-byte aligned), IQ3_XXS's 256 and IQ3_S's 512 as uint32, at the offsets above."""
    signs = ((sign_patterns() < 0) * (1 << np.arange(8))).sum(axis=1).astype(np.int64)
    iq2 = _packed(grid_values("iq2_xs")).view(np.uint32).astype(np.int64)  # lo, hi of each entry
    iq3 = [_packed(grid_values(g)).astype(np.int64) for g in ("iq3_xxs", "iq3_s")]
    flat = np.concatenate([signs, iq2, *iq3])
    assert flat.size == _IQ3_S.value + 512
    return flat.astype(np.uint32).view(np.int8)


@triton.jit
def _gather(base, index, mask):
    """base[index] for index [NU, BN, NT], loaded as [NT, NU, BN]: a gather has no contiguous axis, and Triton's
    tie-break then spreads lanes over its first axis; with the words first that is the word loads' own layout (words
    fastest, then units), so no conversion goes through shared memory."""
    got = tl.load(base + tl.permute(index, (2, 0, 1)), mask=tl.permute(mask, (2, 0, 1)), other=0)
    return tl.permute(got, (1, 2, 0))


@triton.jit
def _value(entry, shift: tl.constexpr, signs, bit: tl.constexpr):
    """The byte of a grid entry at `shift` as an exact float, negated where bit `bit` of the sign byte is set."""
    flip = ((signs >> bit) & 1) << 31
    return (codes(entry, shift, 255, 0.0).to(tl.int32, bitcast=True) ^ flip).to(tl.float32, bitcast=True)


@triton.jit
def _dot8(lo, hi, signs, x_at, t, um):
    """Sum over the word's 8 weights (4 in uint32 `lo`, 4 in `hi`, [NU, BN, NT]) of value * x, x at x_at[u] + 8t."""
    x0, x1, x2, x3 = quads(x_at, 2 * t, um)
    s = _value(lo, 0, signs, 0) * x0[:, None, :] + _value(lo, 8, signs, 1) * x1[:, None, :]
    s += _value(lo, 16, signs, 2) * x2[:, None, :] + _value(lo, 24, signs, 3) * x3[:, None, :]
    x0, x1, x2, x3 = quads(x_at + 4, 2 * t, um)
    s += _value(hi, 0, signs, 4) * x0[:, None, :] + _value(hi, 8, signs, 5) * x1[:, None, :]
    s += _value(hi, 16, signs, 6) * x2[:, None, :] + _value(hi, 24, signs, 7) * x3[:, None, :]
    return s


@triton.jit
def grid_unit_dot(FMT: tl.constexpr, w, row_base, blk, x_at, t, um, bm, codes_tab):
    """`wide_gemv._unit_dot` for IQ2_XS (FMT 6), IQ3_XXS (8), IQ3_S (9): unit blk = sub-block blk % 8 of
    super-block blk // 8; NT = 4 words of 8 weights; codes_tab: `decode.code_tables`. Returns the scaled partial
    dots [NU, BN, NT]."""
    tab = (codes_tab + WORD_TABLES_AT).to(tl.pointer_type(tl.int32))
    m = bm[:, :, None]
    sub = (blk % 8)[:, None, None]
    h16 = w.to(tl.pointer_type(tl.uint16))
    # Every field is read per word ([NU, BN, NT], the NT words of a unit-row reading one address), through
    # `_gather` where the address does not run with the word: all loads then share the word loads' layout (words
    # fastest, then units), so none is converted through shared memory.
    if FMT == 6:
        block = row_base[:, :, None] + ((blk // 8) * 74)[:, None, None] + 0 * t[None, None, :]
    elif FMT == 8:
        block = row_base[:, :, None] + ((blk // 8) * 98)[:, None, None] + 0 * t[None, None, :]
    else:
        block = row_base[:, :, None] + ((blk // 8) * 110)[:, None, None] + 0 * t[None, None, :]
    d = _gather(h16, block // 2, m).to(tl.float16, bitcast=True).to(tl.float32)
    word = tl.load(h16 + block // 2 + 1 + 4 * sub + t[None, None, :], mask=m, other=0).to(tl.int32)
    if FMT == 6:  # IQ2_XS: word = 9-bit grid index | 7-bit sign index << 9; a 4-bit scale per two words
        entry = _gather(tab.to(tl.pointer_type(tl.uint64)) + _IQ2_XS // 2, word & 511, m)
        signs = _gather(tab + _SIGN_BYTES, word >> 9, m)
        s = _dot8(entry.to(tl.uint32).to(tl.int32, bitcast=True),
                  (entry >> 32).to(tl.uint32).to(tl.int32, bitcast=True), signs, x_at, t, um)
        nibble = (_gather(w, block + 66 + sub, m).to(tl.int32) >> (4 * (t[None, None, :] // 2))) & 15
        return s * (d * (0.5 + nibble.to(tl.float32)) * 0.25)
    elif FMT == 8:  # IQ3_XXS: word = two grid bytes; per sub-block a uint32 of 4 x 7-bit sign indices and a scale
        aux_at = block // 2 + 33 + 2 * sub  # the uint32 at byte 66 + 4 sub, read as two halfwords
        aux = _gather(h16, aux_at, m).to(tl.int32) | (_gather(h16, aux_at + 1, m).to(tl.int32) << 16)
        signs = _gather(tab + _SIGN_BYTES, (aux >> (7 * t[None, None, :])) & 127, m)
        lo = _gather(tab + _IQ3_XXS, word & 255, m)
        hi = _gather(tab + _IQ3_XXS, word >> 8, m)
        scale = d * (0.5 + ((aux >> 28) & 15).to(tl.float32)) * 0.5
        return _dot8(lo, hi, signs, x_at, t, um) * scale
    else:  # IQ3_S: word = two low index bytes, their 9th bits in qh byte `sub`; a sign byte per word
        qh = _gather(w, block + 66 + sub, m).to(tl.int32) >> (2 * t[None, None, :])
        lo = _gather(tab + _IQ3_S, (word & 255) | ((qh & 1) << 8), m)
        hi = _gather(tab + _IQ3_S, (word >> 8) | ((qh & 2) << 7), m)
        signs = tl.load(w + block + 74 + 4 * sub + t[None, None, :], mask=m, other=0).to(tl.int32)
        nibble = (_gather(w, block + 106 + sub // 2, m).to(tl.int32) >> (4 * (sub % 2))) & 15
        return _dot8(lo, hi, signs, x_at, t, um) * (d * (1 + 2 * nibble).to(tl.float32))
