"""Per-format decoding of a 32-weight slice of a GGML block into int8 codes and float scales, in Triton.

Every expert kernel reads its weights through `decode32`: the slice's weights are `q * s + mn`, with `s = s_lo` on
the first 16 values and `s_hi` on the last 16 (they differ only for the formats with a scale per 16 weights), and
`mn` non-zero only for the formats with a per-sub-block offset (Q4_K). So an int8 dot of the codes against int8
activations gives an exact integer that the kernels scale in their epilogue.

The lookup tables (IQ grids, sign patterns, IQ4_NL levels) are all small integers; they live in one int8 tensor per
device (`code_tables`). `dequantize_rows` runs the decoder alone, for the tests against `strata.quant.dequantize`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from strata.errors import StrataError
from strata.kernels.moe.dispatch import use_triton
from strata.kernels.moe.grid_words import WORD_TABLES_AT, word_table_bytes
from strata.quant import dequantize, get_format
from strata.quant.tables import grid_values, iq4_nl_levels, sign_patterns


@dataclass(frozen=True)
class DecodeSpec:
    """What a kernel needs to know about a format at compile time."""

    name: str
    fmt_id: int  # the constexpr selecting the branch of decode32
    block_size: int
    type_size: int
    split16: bool = False  # a scale per 16 weights: two dots per slice
    has_min: bool = False  # w = s*q + mn: the kernels add mn times the activation codes' sum
    scale_per_64: bool = False  # one scale per 64 weights (Q2_0): both halves of a 64-step share it


SPECS = {
    s.name: s
    for s in [
        DecodeSpec("Q2_0", 0, 64, 18, scale_per_64=True),
        DecodeSpec("Q4_0", 1, 32, 18),
        DecodeSpec("Q8_0", 2, 32, 34),
        DecodeSpec("IQ4_NL", 3, 32, 18),
        DecodeSpec("IQ4_XS", 4, 256, 136),
        DecodeSpec("IQ2_XXS", 5, 256, 66),
        DecodeSpec("IQ2_XS", 6, 256, 74, split16=True),
        DecodeSpec("IQ2_S", 7, 256, 82, split16=True),
        DecodeSpec("IQ3_XXS", 8, 256, 98),
        DecodeSpec("IQ3_S", 9, 256, 110),
        DecodeSpec("Q4_K", 10, 256, 144, has_min=True),
    ]
}


def decode_spec(qtype: int | str) -> DecodeSpec:
    name = get_format(qtype).name
    if name not in SPECS:
        raise StrataError(f"the prompt expert kernels do not decode {name} (they do: {', '.join(SPECS)})")
    return SPECS[name]


# Offsets (in entries) of the tables inside the one int8 table tensor (constexpr: kernels may read them).
_SIGNS, _IQ2_XXS, _IQ2_XS, _IQ2_S = tl.constexpr(0), tl.constexpr(1024), tl.constexpr(3072), tl.constexpr(7168)
_IQ3_XXS, _IQ3_S, _IQ4_NL = tl.constexpr(15360), tl.constexpr(16384), tl.constexpr(18432)


@functools.cache
def code_tables(device: torch.device) -> torch.Tensor:
    """int8 [26128]: sign patterns [128, 8], the IQ2/IQ3 grids, then IQ4_NL's 16 levels, at the offsets above;
    then the word kernels' packed grids (`grid_words.word_table_bytes`)."""
    parts = [sign_patterns(), *(grid_values(g) for g in ("iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s")),
             iq4_nl_levels()]
    flat = np.concatenate([p.reshape(-1) for p in parts]).astype(np.int8)
    assert flat.size == _IQ4_NL.value + 16 == WORD_TABLES_AT.value
    return torch.from_numpy(np.concatenate([flat, word_table_bytes()])).to(device)


@triton.jit
def _fp16(at, mask):
    """The little-endian fp16 at byte pointers `at`, as float32."""
    lo = tl.load(at, mask=mask, other=0).to(tl.uint16)
    hi = tl.load(at + 1, mask=mask, other=0).to(tl.uint16)
    return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _u32(at, mask):
    word = tl.load(at, mask=mask, other=0).to(tl.uint32)
    for i in tl.static_range(1, 4):
        word = word | (tl.load(at + i, mask=mask, other=0).to(tl.uint32) << (8 * i))
    return word


@triton.jit
def _nibble(byte, j):
    """Value j of a 32-weight run packed as 16 low nibbles then 16 high nibbles of the same 16 bytes."""
    return tl.where(j < 16, byte & 15, byte >> 4)


@triton.jit
def _signed(codes, tab, sign_index, j):
    """Apply a 7-bit sign-pattern index (the 8th sign is the parity) to the codes."""
    return codes * tl.load(tab + _SIGNS + sign_index * 8 + j % 8).to(tl.int32)


@triton.jit
def _parity_signs(index):
    """A 7-bit sign index -> its 8 sign bits (the 8th makes the count of minus signs even), as the table holds."""
    p = index ^ (index >> 4)
    p = p ^ (p >> 2)
    p = p ^ (p >> 1)
    return index | ((p & 1) << 7)


@triton.jit
def _grid_codes(rows, signs, BN: tl.constexpr):
    """Four groups of 8 codes: grid rows as int64 words [BN, 4] (byte j = code j) and their sign bits [BN, 4] ->
    int32 codes [BN, 32]. The grid rows come as words: one load per 4 or 8 codes, not one per code."""
    j = tl.arange(0, 8)[None, None, :]
    byte = ((rows[:, :, None] >> (8 * j)) & 255).to(tl.int32)
    negative = ((signs[:, :, None] >> j) & 1) != 0
    return tl.reshape(tl.where(negative, -byte, byte), (BN, 32))


@triton.jit
def _grid8(tab, offset: tl.constexpr, index):
    """Rows of an 8-byte grid at `index` as int64 words."""
    return tl.load(tab.to(tl.pointer_type(tl.int64)) + offset // 8 + index)


@triton.jit
def _grid4x2(tab, offset: tl.constexpr, index_lo, index_hi):
    """Two rows of a 4-byte grid as one int64 word: the row at index_lo in bytes 0-3, index_hi in bytes 4-7."""
    at = tab.to(tl.pointer_type(tl.int32)) + offset // 4
    lo = tl.load(at + index_lo).to(tl.int64) & 0xFFFFFFFF
    return lo | (tl.load(at + index_hi).to(tl.int64) << 32)


@triton.jit
def decode32(FMT: tl.constexpr, w, blk, sub, tab, nm):
    """Weights [sub*32, sub*32 + 32) of the blocks at byte offsets blk [BN] of w.

    Returns codes int8 [BN, 32], s_lo, s_hi, mn float32 [BN]; masked rows decode to scale 0. (Byte loads are
    written out rather than put in a helper: under the interpreter every helper call costs more than the load.)
    """
    j = tl.arange(0, 32)[None, :]
    BN: tl.constexpr = blk.shape[0]
    block = w + blk  # [BN] pointers to the blocks: per-row fields
    rows = block[:, None]  # [BN, 1]: per-weight fields
    m = nm[:, None]
    d_bits = tl.load(block, mask=nm, other=0).to(tl.uint16) | (tl.load(block + 1, mask=nm, other=0).to(tl.uint16) << 8)
    d = d_bits.to(tl.float16, bitcast=True).to(tl.float32)
    s_lo = d
    s_hi = d
    mn = tl.zeros(blk.shape, tl.float32)
    if FMT == 0:  # Q2_0: 2-bit codes c, weight d*(c - 1); 16 bytes per 64 weights
        byte = tl.load(rows + 2 + sub * 8 + j // 4, mask=m, other=0).to(tl.int32)
        q = ((byte >> ((j % 4) * 2)) & 3) - 1
    elif FMT == 1:  # Q4_0
        q = _nibble(tl.load(rows + 2 + j % 16, mask=m, other=0).to(tl.int32), j) - 8
    elif FMT == 2:  # Q8_0
        q = tl.load(rows + 2 + j, mask=m, other=0).to(tl.int8, bitcast=True).to(tl.int32)
    elif FMT == 3:  # IQ4_NL: 4-bit indices of 16 non-linear levels
        index = _nibble(tl.load(rows + 2 + j % 16, mask=m, other=0).to(tl.int32), j)
        q = tl.load(tab + _IQ4_NL + index).to(tl.int32)
    elif FMT == 4:  # IQ4_XS: a 6-bit scale per 32, low nibbles at byte 4, top bits in the uint16 at byte 2
        low = (tl.load(block + 4 + sub // 2, mask=nm, other=0).to(tl.int32) >> (4 * (sub % 2))) & 15
        high = (tl.load(block + 2 + sub // 4, mask=nm, other=0).to(tl.int32) >> (2 * (sub % 4))) & 3
        s_lo = d * ((low | (high << 4)) - 32).to(tl.float32)
        s_hi = s_lo
        index = _nibble(tl.load(rows + 8 + 16 * sub + j % 16, mask=m, other=0).to(tl.int32), j)
        q = tl.load(tab + _IQ4_NL + index).to(tl.int32)
    elif FMT == 5:  # IQ2_XXS: per 32, 4 grid bytes then a uint32 of 4x7 sign indices and a 4-bit scale
        aux = _u32(block + 2 + 8 * sub + 4, nm)
        s_lo = d * (0.5 + (aux >> 28).to(tl.float32)) * 0.25
        s_hi = s_lo
        g = tl.arange(0, 4)[None, :]
        index = tl.load(rows + 2 + 8 * sub + g, mask=m, other=0).to(tl.int32)
        q = _grid_codes(_grid8(tab, _IQ2_XXS, index), _parity_signs(((aux[:, None] >> (7 * g)) & 127).to(tl.int32)), BN)
    elif FMT == 6:  # IQ2_XS: uint16 words (9-bit grid index, 7-bit sign index), a 4-bit scale per 16
        g = tl.arange(0, 4)[None, :]
        word = tl.load((rows + 2 + 8 * sub).to(tl.pointer_type(tl.uint16)) + g, mask=m, other=0).to(tl.int32)
        q = _grid_codes(_grid8(tab, _IQ2_XS, word & 511), _parity_signs(word >> 9), BN)
        scales = tl.load(block + 66 + sub, mask=nm, other=0).to(tl.int32)
        s_lo = d * (0.5 + (scales & 15).to(tl.float32)) * 0.25
        s_hi = d * (0.5 + (scales >> 4).to(tl.float32)) * 0.25
    elif FMT == 7:  # IQ2_S: 10-bit grid index (8 low bits + 2 in qh), explicit sign bits, a 4-bit scale per 16
        g = tl.arange(0, 4)[None, :]
        qh = tl.load(block + 66 + sub, mask=nm, other=0).to(tl.int32)[:, None]
        index = tl.load(rows + 2 + 4 * sub + g, mask=m, other=0).to(tl.int32) | (((qh >> (2 * g)) & 3) << 8)
        q = _grid_codes(_grid8(tab, _IQ2_S, index), tl.load(rows + 34 + 4 * sub + g, mask=m, other=0).to(tl.int32), BN)
        scales = tl.load(block + 74 + sub, mask=nm, other=0).to(tl.int32)
        s_lo = d * (0.5 + (scales & 15).to(tl.float32)) * 0.25
        s_hi = d * (0.5 + (scales >> 4).to(tl.float32)) * 0.25
    elif FMT == 8:  # IQ3_XXS: 64 grid bytes (4 weights each), then per 32 a uint32 of signs and scale
        aux = _u32(block + 66 + 4 * sub, nm)
        s_lo = d * (0.5 + (aux >> 28).to(tl.float32)) * 0.5
        s_hi = s_lo
        g = tl.arange(0, 4)[None, :]
        first = rows + 2 + 8 * sub + 2 * g  # grid bytes 2g and 2g + 1: the two halves of group g
        grid = _grid4x2(tab, _IQ3_XXS, tl.load(first, mask=m, other=0).to(tl.int32),
                        tl.load(first + 1, mask=m, other=0).to(tl.int32))
        q = _grid_codes(grid, _parity_signs(((aux[:, None] >> (7 * g)) & 127).to(tl.int32)), BN)
    elif FMT == 9:  # IQ3_S: 9-bit grid index (8 low bits + 1 in qh), explicit sign bits, a 4-bit scale per 32
        g = tl.arange(0, 4)[None, :]
        qh = tl.load(block + 66 + sub, mask=nm, other=0).to(tl.int32)[:, None]
        first = rows + 2 + 8 * sub + 2 * g
        grid = _grid4x2(tab, _IQ3_S, tl.load(first, mask=m, other=0).to(tl.int32) | (((qh >> (2 * g)) & 1) << 8),
                        tl.load(first + 1, mask=m, other=0).to(tl.int32) | (((qh >> (2 * g + 1)) & 1) << 8))
        q = _grid_codes(grid, tl.load(rows + 74 + 4 * sub + g, mask=m, other=0).to(tl.int32), BN)
        scale = (tl.load(block + 106 + sub // 2, mask=nm, other=0).to(tl.int32) >> (4 * (sub % 2))) & 15
        s_lo = d * (1 + 2 * scale).to(tl.float32)
        s_hi = s_lo
    else:  # Q4_K: w = d*sc*q - dmin*m with 6-bit sc, m per 32 packed in 12 bytes; nibbles in 32-byte chunks
        a = tl.load(block + 4 + sub, mask=nm, other=0).to(tl.int32)
        c = tl.load(block + 8 + sub, mask=nm, other=0).to(tl.int32)
        e = tl.load(block + sub, mask=nm, other=0).to(tl.int32)
        scale = tl.where(sub < 4, a & 63, (c & 15) | ((e >> 2) & 48))
        mins = tl.where(sub < 4, c & 63, (c >> 4) | ((a >> 2) & 48))
        s_lo = d * scale.to(tl.float32)
        s_hi = s_lo
        mn = -(_fp16(block + 2, nm) * mins.to(tl.float32))
        q = (tl.load(rows + 16 + 32 * (sub // 2) + j, mask=m, other=0).to(tl.int32) >> (4 * (sub % 2))) & 15
    return q.to(tl.int8), s_lo, s_hi, mn


@triton.jit
def q2_0_words(blocks, nm):
    """The Q2_0 blocks at byte pointers blocks [BN], read as little-endian uint16 words (blocks are 18 bytes: only
    2-byte aligned): scale d float32 [BN] and the code words of each 32-weight half, int32 [BN, 4] twice."""
    at = blocks.to(tl.pointer_type(tl.uint16))
    d = tl.load(at, mask=nm, other=0).to(tl.float16, bitcast=True).to(tl.float32)
    i = tl.arange(0, 4)[None, :]
    words0 = tl.load(at[:, None] + 1 + i, mask=nm[:, None], other=0).to(tl.int32)
    words1 = tl.load(at[:, None] + 5 + i, mask=nm[:, None], other=0).to(tl.int32)
    return d, words0, words1


@triton.jit
def _code2(words, j):
    return ((words >> (2 * j)) & 3) - 1


@triton.jit
def q2_0_codes(words, BN: tl.constexpr):
    """int32 [BN, 4] code words -> int8 codes - 1 [BN, 32]: weight 8i + j sits in bits 2j of word i. Built by joins
    (each adds a last axis of 2, in the same thread: a join of codes 2^b apart, highest b first, gives natural order),
    which keep a word's 8 codes in one thread, so that they reach shared memory as 8 bytes, not one by one."""
    even = tl.join(tl.join(_code2(words, 0), _code2(words, 4)), tl.join(_code2(words, 2), _code2(words, 6)))
    odd = tl.join(tl.join(_code2(words, 1), _code2(words, 5)), tl.join(_code2(words, 3), _code2(words, 7)))
    return tl.reshape(tl.join(even, odd), (BN, 32)).to(tl.int8)


@triton.jit
def _spread_minus_one(b):
    """A byte of 4 two-bit codes (code j in bits 2j) -> an int32 whose byte j is code j - 1 (as int8), computed on
    whole words: the codes are spread to bytes by shifts and masks, then one is taken from each byte without borrows
    (each byte's top bit set first, then cleared again)."""
    s = (b | (b << 12)) & 0x000F000F
    s = (s | (s << 6)) & 0x03030303
    return ((s | -0x7F7F7F80) - 0x01010101) ^ -0x7F7F7F80  # 0x80808080 as an int32


@triton.jit
def _byte(s, j: tl.constexpr):
    return ((s >> (8 * j)) & 255).to(tl.int8)


@triton.jit
def q2_0_codes_words(words, NW: tl.constexpr):
    """int32 [NW, 4] code words -> int8 codes - 1 [NW, 32] (weight 8i + j in bits 2j of word i), as `q2_0_codes`
    but four codes per 32-bit operation (a third of the instructions); the bytes are joined in register order (code
    j of a word's half h at 4h + j), so that packing them back to words for shared memory needs no byte moves."""
    lo = _spread_minus_one(words & 255)
    hi = _spread_minus_one((words >> 8) & 255)
    u0 = tl.join(_byte(lo, 0), _byte(hi, 0))
    u1 = tl.join(_byte(lo, 1), _byte(hi, 1))
    u2 = tl.join(_byte(lo, 2), _byte(hi, 2))
    u3 = tl.join(_byte(lo, 3), _byte(hi, 3))
    return tl.reshape(tl.join(tl.join(u0, u2), tl.join(u1, u3)), (NW, 32))


@triton.jit
def _dequantize_kernel(w, tab, out, n_rows, row_bytes, K: tl.constexpr,
                       FMT: tl.constexpr, QK: tl.constexpr, TS: tl.constexpr, BN: tl.constexpr):
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    nm = rows < n_rows
    j = tl.arange(0, 32)
    for k in range(0, K, 32):
        blk = rows.to(tl.int64) * row_bytes + (k // QK) * TS
        q, s_lo, s_hi, mn = decode32(FMT, w, blk, (k % QK) // 32, tab, nm)
        s = tl.where(j[None, :] < 16, s_lo[:, None], s_hi[:, None])
        value = q.to(tl.float32) * s + mn[:, None]
        tl.store(out + rows[:, None].to(tl.int64) * K + k + j[None, :], value, mask=nm[:, None])


def dequantize_rows(raw: torch.Tensor, qtype: int | str, shape: tuple[int, int]) -> torch.Tensor:
    """The weights of raw uint8 [rows, row_bytes] as float32 [rows, cols]."""
    return (dequantize_rows_triton if use_triton(raw) else dequantize_rows_ref)(raw, qtype, shape)


def dequantize_rows_triton(raw: torch.Tensor, qtype: int | str, shape: tuple[int, int]) -> torch.Tensor:
    """Through decode32, the expert kernels' own decoder."""
    spec = decode_spec(qtype)
    rows, cols = shape
    out = torch.empty(rows, cols, dtype=torch.float32, device=raw.device)
    grid = (triton.cdiv(rows, 32),)
    _dequantize_kernel[grid](raw, code_tables(raw.device), out, rows, raw.shape[-1], cols,
                             FMT=spec.fmt_id, QK=spec.block_size, TS=spec.type_size, BN=32)
    return out


def dequantize_rows_ref(raw: torch.Tensor, qtype: int | str, shape: tuple[int, int]) -> torch.Tensor:
    return dequantize(raw, qtype, shape)
