"""Q4_0 rows re-laid for 16-byte loads, and the dp4a decode matvec that reads them (issue 4, STRATA_DP4A_SPLIT).

GGUF lays a Q4_0 row as 18-byte blocks (an fp16 scale, then 16 code bytes), so a block's codes sit at a 2-byte
alignment and a kernel reading them as they lie issues 2-byte loads: session 15's probe
(tools/device/megakernel_probe.py, "q4") read an A3B token's bytes that way at 50-58 % of the HBM bound where the
same bytes read 16 bytes a load reach 94-100 % under the same launch chain. "Split" rows keep every row's bytes
and size (so row strides, slices and copies are unchanged) but put the row's code bytes first, block after block,
then its fp16 scales: for rows of a multiple of 256 weights (18 x 8 = 144 bytes, a multiple of 16) each block's
16 code bytes are then one aligned 16-byte load.

`split_dp4a_matvec` is a one-shot program of BN rows (`oneshot_gemv`'s form): every code word and scale of its rows
is loaded in one burst before the PDL wait (weights no kernel of the step writes), x after it. x comes rounded to
int8 codes per 32 values (`dp4a_gemv.quantize_x`: codes, scales, code sums) and a block's dot is integer work,
`dp4a_gemv`'s way: a code word i holds weights 4i..4i+3 in its low nibbles and 16+4i.. in its high ones; the low
nibbles masked to bytes go through a `dp4a` against the activation's code word i (codes 4i..4i+3), the high ones
masked in place (16 q) against word 4 + i, that second sum divided by 16 once (exact), -8 x the block's code sum
the first's start; then one float multiply by the two scales a block. A block's 16 activation code bytes lie as
its 16 weight code bytes do (a 16-byte load of each, in the same register layout): 1.3-2.1 instructions a weight
in sm_90 builds. Bound: dp4a_gemv's `row_error_bound` (x's rounding, ~0.5 % of max |y| at A3B's rows), asserted by
tests/kernels/quant/test_q4_0_split.py. (A float form on split rows, x unrounded, measured slower than the
engine's float matvec on GGUF rows: docs/BENCHMARKS.md, session 15.)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from strata.kernels.moe.dp4a_gemv import BLOCK_BYTES, dp4a
from strata.kernels.moe.quantize32 import GROUP as BLOCK_WEIGHTS
from strata.kernels.pdl import launch_options, pdl_start, pdl_wait

CODE_BYTES = BLOCK_BYTES - 2  # after each block's fp16 scale
ALIGN_WEIGHTS = 256  # rows of a multiple of this many weights keep every row start 16-byte aligned


def splits(n_in: int) -> bool:
    """Whether rows of n_in weights can take the split layout (each row's codes 16-byte aligned)."""
    return n_in > 0 and n_in % ALIGN_WEIGHTS == 0


def split_rows(raw: torch.Tensor) -> torch.Tensor:
    """uint8 [rows, row_bytes] of GGUF Q4_0 blocks -> the same rows split: all code bytes, then all scales."""
    n, row_bytes = raw.shape
    blocks = raw.reshape(n, row_bytes // BLOCK_BYTES, BLOCK_BYTES)
    return torch.cat([blocks[:, :, 2:].reshape(n, -1), blocks[:, :, :2].reshape(n, -1)], dim=1)


def join_rows(split: torch.Tensor) -> torch.Tensor:
    """The inverse of `split_rows`: GGUF Q4_0 rows again."""
    n, row_bytes = split.shape
    n_blocks = row_bytes // BLOCK_BYTES
    codes = split[:, :n_blocks * CODE_BYTES].reshape(n, n_blocks, CODE_BYTES)
    scales = split[:, n_blocks * CODE_BYTES:].reshape(n, n_blocks, 2)
    return torch.cat([scales, codes], dim=2).reshape(n, row_bytes)


@triton.jit
def _split_dp4a_kernel(xq, xs, xsum, w, y, n_out, K: tl.constexpr, NBP: tl.constexpr, BN: tl.constexpr,
                       ROWS: tl.constexpr, PDL: tl.constexpr = 0):
    """y[r, rows] = W[rows] . x[r] for the ROWS rows of x (`quantize_x` codes int8 [ROWS, K], scales and code sums
    [ROWS, K / 32]), BN weight rows a program, K weights a row (NBP: its blocks' count rounded up to a power of two).
    Each row of x runs the same code on the same registers: its sums do not depend on ROWS."""
    pdl_start(PDL)
    NB: tl.constexpr = K // 32
    ROW_BYTES: tl.constexpr = NB * 18
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    b = tl.arange(0, NBP)
    live = (rows < n_out)[:, None] & (b < NB)[None, :]
    at = w + rows.to(tl.int64) * ROW_BYTES  # [BN]: each row's first byte, 16-byte aligned
    i = tl.arange(0, 4)
    words = tl.load(at[:, None, None].to(tl.pointer_type(tl.int32)) + (b * 4)[None, :, None] + i[None, None, :],
                    mask=live[:, :, None], other=0)  # [BN, NBP, 4]: a block's 16 code bytes, one 16-byte load
    d = tl.load((at + NB * 16)[:, None].to(tl.pointer_type(tl.uint16)) + b[None, :], mask=live, other=0)
    d = d.to(tl.float16, bitcast=True).to(tl.float32)
    pdl_wait(PDL)  # the weights above: no kernel of the step writes them (kernels/pdl.py); x and y after
    low_codes = words & 0x0F0F0F0F
    high_codes = words & -252645136  # 0xF0F0F0F0: the high nibbles in place, 16 q a byte
    xm = (b < NB)[:, None]
    for r in tl.static_range(ROWS):
        x_at = xq.to(tl.pointer_type(tl.int32)) + r * (K // 4) + (b * 8)[:, None] + i[None, :]
        x_low = tl.load(x_at, mask=xm, other=0)[None]  # codes 4i..4i+3 of each block
        x_high = tl.load(x_at + 4, mask=xm, other=0)[None]  # codes 16 + 4i..
        scale = tl.load(xs + r * NB + b, mask=b < NB, other=0.0)
        start = tl.load(xsum + r * NB + b, mask=b < NB, other=0) * -8
        low = tl.sum(dp4a(low_codes, x_low, tl.zeros_like(words)), axis=2) + start[None, :]
        high = tl.sum(dp4a(high_codes, x_high, tl.zeros_like(words)), axis=2)
        blocks = (low + (high >> 4)).to(tl.float32) * (d * scale[None, :])  # |int| < 2^17: exact in float32
        tl.store(y + r * n_out + rows, tl.sum(blocks, axis=1).to(y.dtype.element_ty), mask=rows < n_out)


def _check(n_in: int, split: torch.Tensor, n_out: int) -> None:
    if not splits(n_in) or split.shape != (n_out, n_in // BLOCK_WEIGHTS * BLOCK_BYTES):
        raise ValueError(f"split Q4_0 rows {tuple(split.shape)} do not hold a [{n_out}, {n_in}] weight")


def split_dp4a_matvec(xq, split: torch.Tensor, n_out: int, bn: int = 16, warps: int = 4,
                      out: torch.Tensor | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """x as `dp4a_gemv.quantize_x`'s (codes [T, K], scales, sums; T <= 4) times the [n_out, K] Q4_0 weight in split
    rows: [T, n_out] of `dtype` (or into `out`)."""
    codes, scales, sums = xq
    n_rows, n_in = codes.shape
    _check(n_in, split, n_out)
    y = out if out is not None else torch.empty(n_rows, n_out, dtype=dtype, device=codes.device)
    _split_dp4a_kernel[(triton.cdiv(n_out, bn),)](
        codes, scales, sums, split, y, n_out, K=n_in, NBP=triton.next_power_of_2(n_in // BLOCK_WEIGHTS), BN=bn,
        ROWS=n_rows, num_warps=warps, **launch_options(codes))
    return y
