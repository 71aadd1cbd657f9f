"""Rows rounded to int8 per 32 values: `code = rint(x * (127 / a))` with a = max|x| over the 32, scale a / 127.

The int8 expert paths round the prompt's activations once per token with `quantize_rows`, and the fused gate/up
kernel rounds H in its epilogue with the same device function, `round_groups`. Each group also keeps the sum of its
codes, which the formats with a per-block offset (Q4_K) multiply by their minimum.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from strata.kernels.moe.dispatch import use_triton
from strata.kernels.work_arena import AllocatorScratch

GROUP = 32
_RINT = tl.constexpr(12582912.0)  # 1.5 * 2^23: adding and subtracting it rounds a float32 below 2^22 to the nearest even integer


@triton.jit
def round_groups(v, BM: tl.constexpr, BN: tl.constexpr):
    """float32 [BM, BN] -> int8 codes [BM, BN], scales float32 [BM, BN // 32], code sums int32 [BM, BN // 32]."""
    g = tl.reshape(v, (BM, BN // 32, 32))
    a = tl.max(tl.abs(g), axis=2)
    inv = tl.where(a > 0, tl.math.div_rn(tl.full(a.shape, 127.0, tl.float32), tl.where(a > 0, a, 1.0)), 0.0)
    codes = (g * inv[:, :, None] + _RINT) - _RINT
    return (tl.reshape(codes, (BM, BN)).to(tl.int8), tl.math.div_rn(a, tl.full(a.shape, 127.0, tl.float32)),
            tl.sum(codes, axis=2).to(tl.int32))


@triton.jit
def _quantize_kernel(x, codes, scales, sums, n_rows, K: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BK + tl.arange(0, BK)
    groups = tl.program_id(1) * (BK // 32) + tl.arange(0, BK // 32)
    rm = rows[:, None] < n_rows
    r64 = rows[:, None].to(tl.int64)
    v = tl.load(x + r64 * K + cols[None, :], mask=rm & (cols[None, :] < K), other=0.0).to(tl.float32)
    q, s, total = round_groups(v, BM, BK)
    tl.store(codes + r64 * K + cols[None, :], q, mask=rm & (cols[None, :] < K))
    gm = rm & (groups[None, :] < K // 32)
    tl.store(scales + r64 * (K // 32) + groups[None, :], s, mask=gm)
    tl.store(sums + r64 * (K // 32) + groups[None, :], total, mask=gm)


def quantize_rows(x: torch.Tensor, out=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [R, K] (K a multiple of 32) -> codes int8 [R, K], scales float32 [R, K/32], code sums int32 [R, K/32];
    written into `out` (those three tensors, e.g. `rounded_rows_buffers`) when given."""
    return (quantize_rows_triton if use_triton(x) else quantize_rows_ref)(x, out)


def rounded_rows_buffers(scratch, n_rows: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Codes, scales and sums for n_rows rows of k values, from `scratch` (a WorkArena or AllocatorScratch)."""
    return (scratch.empty((n_rows, k), torch.int8), scratch.empty((n_rows, k // GROUP), torch.float32),
            scratch.empty((n_rows, k // GROUP), torch.int32))


def quantize_rows_triton(x: torch.Tensor, out=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = x.contiguous()
    n_rows, k = x.shape
    if out is None:
        out = rounded_rows_buffers(AllocatorScratch(x.device), n_rows, k)
    codes, scales, sums = out
    bm, bk = (16 if x.is_cuda else 128), min(256, triton.next_power_of_2(k))  # the interpreter pays per operation
    if n_rows:
        # No fused multiply-add: x * inv rounds to float32 before the rounding to an integer, as in the reference.
        _quantize_kernel[(triton.cdiv(n_rows, bm), triton.cdiv(k, bk))](
            x, codes, scales, sums, n_rows, K=k, BM=bm, BK=bk, enable_fp_fusion=False)
    return codes, scales, sums


def quantize_rows_ref(x: torch.Tensor, out=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n_rows, k = x.shape
    g = x.float().reshape(n_rows, k // GROUP, GROUP)
    a = g.abs().amax(dim=2)
    full = torch.full_like(a, 127.0)  # tensor by tensor: torch divides by a scalar through its reciprocal
    inv = torch.where(a > 0, full / a, torch.zeros_like(a))
    codes = torch.round(g * inv[:, :, None])
    rounded = codes.reshape(n_rows, k).to(torch.int8), a / full, codes.sum(dim=2).int()
    if out is None:
        return rounded
    for dst, src in zip(out, rounded):
        dst.copy_(src)
    return tuple(out)


def dequantize_rows_int8(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The float64 values the int8 rows stand for (the references' x and H)."""
    n_rows, k = codes.shape
    return (codes.double().reshape(n_rows, k // GROUP, GROUP) * scales.double()[:, :, None]).reshape(n_rows, k)
