"""The top-k combine: y[t] = sum_j w[t, j] * out[row of pair (t, j)], in the order j = 0 .. k-1 (deterministic)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from strata.kernels.moe.dispatch import use_triton


@triton.jit
def _combine_kernel(rows_out, pair_row, weights, y, n_tokens, n_out, TOP_K: tl.constexpr, BT: tl.constexpr,
                    BN: tl.constexpr):
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    n = tl.program_id(1) * BN + tl.arange(0, BN)
    tm = t < n_tokens
    mask = tm[:, None] & (n[None, :] < n_out)
    acc = tl.zeros((BT, BN), tl.float32)
    for j in tl.static_range(TOP_K):
        row = tl.load(pair_row + t * TOP_K + j, mask=tm, other=0).to(tl.int64)
        w = tl.load(weights + t * TOP_K + j, mask=tm, other=0.0).to(tl.float32)
        acc += w[:, None] * tl.load(rows_out + row[:, None] * n_out + n[None, :], mask=mask, other=0.0)
    tl.store(y + t.to(tl.int64)[:, None] * n_out + n[None, :], acc.to(y.dtype.element_ty), mask=mask)


def combine(rows_out: torch.Tensor, pair_row: torch.Tensor, weights: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """rows_out float32 [rows, N]; pair_row int32 [T * k]; weights [T, k] -> [T, N] of dtype."""
    return (combine_triton if use_triton(rows_out) else combine_ref)(rows_out, pair_row, weights, dtype)


def combine_triton(rows_out, pair_row, weights, dtype):
    n_tokens, top_k = weights.shape
    n_out = rows_out.shape[1]
    y = torch.empty(n_tokens, n_out, dtype=dtype, device=rows_out.device)
    bt, bn = 16, min(256, triton.next_power_of_2(n_out))
    if n_tokens:
        _combine_kernel[(triton.cdiv(n_tokens, bt), triton.cdiv(n_out, bn))](
            rows_out, pair_row, weights.contiguous(), y, n_tokens, n_out, TOP_K=top_k, BT=bt, BN=bn)
    return y


def combine_ref(rows_out, pair_row, weights, dtype):
    n_tokens, top_k = weights.shape
    picked = rows_out[pair_row.long()].view(n_tokens, top_k, -1)
    acc = torch.zeros(n_tokens, rows_out.shape[1], dtype=torch.float32, device=rows_out.device)
    for j in range(top_k):
        acc += weights[:, j, None].float() * picked[:, j]
    return acc.to(dtype)
