"""The fp16 fused Q2_0 kernels' register-operand variants: one of the wgmma's operands never in shared memory.

Under "h" a program copies its rows' fp16 values (global -> shared memory) every 64-value step, and the wgmma reads
them back: with the decoded weights' store and read, the L1/shared-memory pipe is the kernels' bound (Nsight: 93 %).
Three variants (`Tiles` letters, with "h") give the wgmma its register operand (A) straight from registers: "a" x
from int8 codes, "r" x's fp16 values, "t" the decoded weights (of the transposed product; sections below).

"a": a program loads the rows' int8 codes (half the bytes) and scales straight into registers, turns them into the
fp16 values `rounded_fp16` gives (bit for bit: code to float32 exactly, times the scale rounded once in float32,
rounded once to fp16), and hands them to the wgmma as its register operand (A): no shared memory for x at all.

For Triton to keep them in registers, the values must sit in the wgmma's operand layout without moving between
threads. A plain [rows, 64] load gives each thread 16 consecutive bytes of one row (4 threads a row, 8 rows a warp,
warps stacked); the operand layout gives each thread pairs of values 8 apart in k, of rows 8 apart. So the program
loads its rows in a permuted order (`operand_rows`) and reads the 64 values of a step in a permuted k order
(`operand_k`), the weights decoded in the same k order: a dot is a sum over k, which any common order of both
operands leaves the same up to float32 rounding (the order of the MMA's sums changes, not its products).
On a GPU the conversion is inline PTX (byte permutes under 2^23's bits, no int-to-float conversions); the
interpreter, which runs no PTX, computes the same values with Triton arithmetic.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Four int8 codes (one 32-bit word) and their scale -> four fp16 values code x scale, two to a 32-bit register.
# Each byte is moved under float32 2^23's bits with 128 added (xor of the sign bit); 2^23 + 128 subtracted gives
# the code exactly; the product is rounded once (mul.rn: never contracted) and then once to fp16, as rounded_fp16.
_CODES_TO_FP16 = tl.constexpr("""{
.reg .b32 u, b0, b1, b2, b3;
.reg .f32 f0, f1, f2, f3;
xor.b32 u, $2, 0x80808080;
prmt.b32 b0, u, 0x4B000000, 0x7440;
prmt.b32 b1, u, 0x4B000000, 0x7441;
prmt.b32 b2, u, 0x4B000000, 0x7442;
prmt.b32 b3, u, 0x4B000000, 0x7443;
sub.rn.f32 f0, b0, 0f4B000080;
sub.rn.f32 f1, b1, 0f4B000080;
sub.rn.f32 f2, b2, 0f4B000080;
sub.rn.f32 f3, b3, 0f4B000080;
mul.rn.f32 f0, f0, $3;
mul.rn.f32 f1, f1, $3;
mul.rn.f32 f2, f2, $3;
mul.rn.f32 f3, f3, $3;
cvt.rn.f16x2.f32 $0, f1, f0;
cvt.rn.f16x2.f32 $1, f3, f2;
}""")

# One load for a thread's four words (16 bytes of one 32-value group): a plain tl.load of the scales would take
# its own layout and a conversion through shared memory every step.
_SCALE_OF_FOUR = tl.constexpr("""{
ld.global.nc.b32 $0, [$4];
mov.b32 $1, $0;
mov.b32 $2, $0;
mov.b32 $3, $0;
}""")


@triton.jit
def operand_rows(BM: tl.constexpr, WARPS: tl.constexpr):
    """int32 [BM]: for each row R of the program's code loads, the tile row it holds, such that the load's threads
    hold the rows the wgmma's register operand gives them (the load: row bits 0-2 by lane, then warps, then
    registers; the operand: row bits 0-2 by lane, bit 3 by register, then warps 16 rows each)."""
    r = tl.arange(0, BM)
    return r % 8 + 8 * ((r // (8 * WARPS)) % 2) + 16 * ((r // 8) % WARPS) + 16 * WARPS * (r // (16 * WARPS))


@triton.jit
def operand_k(v, ROWS: tl.constexpr):
    """[ROWS, 64] values of a step in memory order -> the operand's k order: memory 16t + 4c + 2h + e goes to
    k = 16c + 8h + 2t + e, so that thread t of a row's four holds its 16 consecutive bytes."""
    return tl.reshape(tl.permute(tl.reshape(v, (ROWS, 4, 4, 2, 2)), (0, 2, 3, 1, 4)), (ROWS, 64))


@triton.jit
def load_codes(a, a_scale, a_row, am, k0, K: tl.constexpr, ASM: tl.constexpr):
    """The 64-value step at k0 of the int8 rows a_row (in `operand_rows` order; padding rows clamped to a real
    row): code words int32 [BM, 16] (masked rows 0) and each word's scale float32 [BM, 16]."""
    words = tl.load(a.to(tl.pointer_type(tl.int32)) + a_row[:, None] * (K // 4) + k0 // 4 + tl.arange(0, 16)[None, :],
                    mask=am[:, None], other=0)
    at = a_scale + a_row[:, None] * (K // 32) + k0 // 32 + tl.arange(0, 16)[None, :] // 8
    if ASM:
        scales = tl.inline_asm_elementwise(_SCALE_OF_FOUR, "=r,=r,=r,=r,l,l,l,l", [at], dtype=tl.float32,
                                           is_pure=True, pack=4)
    else:
        scales = tl.load(at)
    return words, scales


@triton.jit
def _half(bits):
    return bits.to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def _code_value(words, scales, j: tl.constexpr):
    """Byte j of each word as code x scale, rounded like rounded_fp16 (the interpreter's form)."""
    code = (words << (24 - 8 * j)) >> 24
    return (code.to(tl.float32) * scales).to(tl.float16)


@triton.jit
def codes_operand(words, scales, BM: tl.constexpr, WARPS: tl.constexpr, ASM: tl.constexpr):
    """fp16 [BM, 64]: the values of `load_codes`' step in the wgmma register operand's row and k order."""
    if ASM:
        lo, hi = tl.inline_asm_elementwise(_CODES_TO_FP16, "=r,=r,r,r", [words, scales], dtype=(tl.int32, tl.int32),
                                           is_pure=True, pack=1)
        v0, v1, v2, v3 = _half(lo), _half(lo >> 16), _half(hi), _half(hi >> 16)
    else:
        v0, v1 = _code_value(words, scales, 0), _code_value(words, scales, 1)
        v2, v3 = _code_value(words, scales, 2), _code_value(words, scales, 3)
    # Joins of values 2^b apart, highest b first, give natural order (see decode.q2_0_codes).
    x = tl.reshape(tl.join(tl.join(v0, v2), tl.join(v1, v3)), (BM, 64))
    return operand_rows_order(operand_k(x, BM), BM, WARPS)


# The "r" variant: the rows' fp16 values themselves (rounded_fp16's, as "h" reads them) loaded straight into the
# operand's registers, with no conversion at all. A 64-value row step is 128 bytes, and a thread can load 16 of
# them at once: so a step is loaded as two 32-value halves of 16 32-bit words a row (4 threads a row, as the
# operand wants), each word the pair of consecutive values one operand register holds.


@triton.jit
def operand_k_halves(v, ROWS: tl.constexpr):
    """[ROWS, 64] values of a step in memory order -> the "r" operand's k order: in each 32-value half, memory
    8t + 4c + 2h + e goes to k = 16c + 8h + 2t + e (thread t of a row's four holds 16 consecutive bytes)."""
    v = tl.permute(tl.reshape(v, (ROWS, 2, 4, 2, 2, 2)), (0, 1, 3, 4, 2, 5))
    return tl.reshape(v, (ROWS, 64))


@triton.jit
def load_fp16_rows(a, a_row, am, k0, K: tl.constexpr):
    """The 64-value step at k0 of the fp16 rows a_row (in `operand_rows` order) as two int32 [BM, 16] word halves
    (masked rows 0)."""
    at = a.to(tl.pointer_type(tl.int32)) + a_row[:, None] * (K // 2) + k0 // 2 + tl.arange(0, 16)[None, :]
    return tl.load(at, mask=am[:, None], other=0), tl.load(at + 16, mask=am[:, None], other=0)


@triton.jit
def _half_values(words, BM: tl.constexpr):
    """int32 [BM, 16] words of fp16 pairs -> fp16 [BM, 32] in memory order."""
    return tl.reshape(tl.join(_half(words), _half(words >> 16)), (BM, 32))


@triton.jit
def fp16_rows_operand(words0, words1, BM: tl.constexpr, WARPS: tl.constexpr):
    """fp16 [BM, 64]: the values of `load_fp16_rows`' step in the wgmma register operand's row and k order."""
    x = tl.reshape(tl.permute(tl.join(_half_values(words0, BM), _half_values(words1, BM)), (0, 2, 1)), (BM, 64))
    return operand_rows_order(operand_k_halves(x, BM), BM, WARPS)


# The "t" variant: the decoded weights as the register operand (A) of a transposed product, acc^T = W x^T, so that
# they never go through shared memory; x is the wgmma's shared-memory operand (B), copied there by Triton's
# pipeline as under "h". The weights reach the operand's registers where they are decoded (one 16-bit code word a
# thread a row and half: `operand_rows` for the weight rows, the `operand_k_halves` k order); x must then be read in
# that k order too, so the fp16 copy of x (`rounded_fp16(..., permuted=True)`) and H (the gate/up epilogue) are
# written with each value at its `operand_k_position`.


@triton.jit
def operand_k_position(m):
    """Where value m of a row goes in a k-permuted copy: in each 32 values, 8t + 4c + 2h + e -> 16c + 8h + 2t + e
    (`operand_k_halves`' order)."""
    j = m % 32
    return m - j + 16 * ((j // 4) % 2) + 8 * ((j // 2) % 2) + 2 * (j // 8) + j % 2


def operand_k_positions(k: int):
    """`operand_k_position` of 0 .. k-1 as a torch index (the copies' torch form, the tests)."""
    import torch
    m = torch.arange(k)
    j = m % 32
    return m - j + 16 * ((j // 4) % 2) + 8 * ((j // 2) % 2) + 2 * (j // 8) + j % 2


@triton.jit
def operand_rows_order(v, ROWS: tl.constexpr, WARPS: tl.constexpr):
    """[ROWS, 64] values of rows loaded in `operand_rows` order -> the operand's rows (the load's (mb, h, w, r) ->
    (mb, w, h, r)): each row lands at the index it was loaded for."""
    MB: tl.constexpr = ROWS // (16 * WARPS)
    return tl.reshape(tl.permute(tl.reshape(v, (MB, 2, WARPS, 8, 64)), (0, 2, 1, 3, 4)), (ROWS, 64))
