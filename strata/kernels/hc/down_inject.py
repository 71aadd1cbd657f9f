"""The read's first matvecs on the normalised stack xn (write_stats.py stores it, float32):
lo = silu((down @ xn) / hc) and inject = inject_w @ xn.
down [rank, hc*embd] and inject [hc, hc*embd] are float tensors (BF16 in the files); their rows are one output
range, so one launch reads both (the final read has no inject).

Each program computes BLOCK_N outputs of ONE row: a row's arithmetic is the same code whatever the call's row
count (a verify window's row equals the one-row step's bit for bit); the rows of a window re-read the weights,
mostly from L2 since their programs run together."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_N = 2  # 162 programs at rank 320 + 4 inject rows: more than the H200's 132 SMs, each streaming 2 rows
BLOCK_K = 2048  # 5 steps over 10,240 inputs; 16 BF16 (two 16-byte loads) a thread a row a step at 4 warps
NUM_WARPS = 4
NUM_STAGES = 3  # Triton's default on sm_90: the loop's loads issued ahead


@triton.jit
def _down_inject_kernel(xn_ptr, down_ptr, inj_w_ptr, lo_ptr, inj_ptr, rank, n_inject, n_in,
                        HC: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    is_down = n < rank
    is_inject = (n >= rank) & (n < rank + n_inject)
    down_rows = tl.where(is_down, n, 0).to(tl.int64) * n_in
    inject_rows = tl.where(is_inject, n - rank, 0).to(tl.int64) * n_in
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, n_in, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_mask = k < n_in
        x = tl.load(xn_ptr + row * n_in + k, mask=k_mask, other=0.0)
        w = tl.load(down_ptr + down_rows[:, None] + k[None, :], mask=is_down[:, None] & k_mask[None, :], other=0.0)
        w += tl.load(inj_w_ptr + inject_rows[:, None] + k[None, :], mask=is_inject[:, None] & k_mask[None, :],
                     other=0.0)
        acc += w.to(tl.float32) * x[None, :]
    total = tl.sum(acc, axis=1)
    v = total / HC  # torch's order: the matvec, then / hc
    tl.store(lo_ptr + row * rank + n, v / (1.0 + tl.exp(-v)), mask=is_down)  # silu(v)
    tl.store(inj_ptr + row * n_inject + (n - rank), total, mask=is_inject)


def down_inject_triton(xn: torch.Tensor, down: torch.Tensor, inject: torch.Tensor | None, block_n: int = BLOCK_N,
                       block_k: int = BLOCK_K, num_warps: int = NUM_WARPS,
                       num_stages: int = NUM_STAGES) -> tuple[torch.Tensor, torch.Tensor | None]:
    """xn [T, hc, embd] float32, down [rank, hc*embd], inject [hc', hc*embd] or None (float tensors, contiguous)
    -> (lo [T, rank] float32, inject [T, hc'] float32 or None)."""
    n_rows, hc, embd = xn.shape
    rank, n_inject = down.shape[0], 0 if inject is None else inject.shape[0]
    lo = torch.empty(n_rows, rank, dtype=torch.float32, device=xn.device)
    injected = torch.empty(n_rows, max(n_inject, 1), dtype=torch.float32, device=xn.device)
    if n_rows:
        grid = (triton.cdiv(rank + n_inject, block_n), n_rows)
        _down_inject_kernel[grid](xn, down, down if inject is None else inject, lo, injected, rank, n_inject,
                                  hc * embd, HC=hc, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps,
                                  num_stages=num_stages)
    return lo, (injected if n_inject else None)
