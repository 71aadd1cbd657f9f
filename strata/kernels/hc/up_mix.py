"""The read's last step: gate = sigmoid(up @ lo) [hc*embd], then mixed[e] = mean_c xn[c, e] * gate[c*embd + e]
from the normalised stack xn [T, hc, embd] (write_stats.py's). A program owns BLOCK_E columns of one row and reads
the hc rows of `up` that gate them, so the mean over streams needs nothing from another program. mixed is stored
in the dtype the step computes in (the cast torch does after the read)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# H200 sweep (`bench hc-read --sweep`, session 6): 4 features a program, one warp: 3.17 us, 16 x 4 warps 8.10 us
BLOCK_E = 4  # 640 programs at embd 2,560, each reading hc * 4 rows of up (10 KB in BF16 at rank 320)
NUM_WARPS = 1


@triton.jit
def _up_mix_kernel(xn_ptr, up_ptr, lo_ptr, out_ptr, embd, rank,
                   HC: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_R: tl.constexpr):
    pid = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    e = pid * BLOCK_E + tl.arange(0, BLOCK_E)
    e_mask = e < embd
    j = tl.arange(0, BLOCK_R)
    j_mask = j < rank
    lo = tl.load(lo_ptr + row * rank + j, mask=j_mask, other=0.0)
    total = tl.zeros((BLOCK_E,), dtype=tl.float32)
    for c in tl.static_range(HC):
        cols = c * embd + e
        w = tl.load(up_ptr + cols.to(tl.int64)[:, None] * rank + j[None, :], mask=e_mask[:, None] & j_mask[None, :],
                    other=0.0)
        logit = tl.sum(w.to(tl.float32) * lo[None, :], axis=1)
        gate = 1.0 / (1.0 + tl.exp(-logit))
        total += tl.load(xn_ptr + row * HC * embd + cols, mask=e_mask, other=0.0) * gate
    tl.store(out_ptr + row * embd + e, (total / HC).to(out_ptr.dtype.element_ty), mask=e_mask)


def up_mix_triton(xn: torch.Tensor, up: torch.Tensor, lo: torch.Tensor, dtype: torch.dtype = torch.float32,
                  block_e: int = BLOCK_E, num_warps: int = NUM_WARPS) -> torch.Tensor:
    """xn [T, hc, embd] float32, up [hc*embd, rank] (float, contiguous), lo [T, rank] float32 -> mixed [T, embd] in
    `dtype`."""
    n_rows, hc, embd = xn.shape
    rank = up.shape[1]
    mixed = torch.empty(n_rows, embd, dtype=dtype, device=xn.device)
    if n_rows:
        _up_mix_kernel[(triton.cdiv(embd, block_e), n_rows)](xn, up, lo, mixed, embd, rank, HC=hc, BLOCK_E=block_e,
                                                             BLOCK_R=triton.next_power_of_2(rank),
                                                             num_warps=num_warps)
    return mixed
