"""A prompt read's last step, row-wise over many rows: mixed[t, e] = mean_c xn[t, c, e] * sigmoid(g[t, c*embd + e])
from the normalised stack xn [T, hc, embd] and the up GEMM's output g [T, hc*embd] (cuBLAS's), one pass over both
where torch takes a sigmoid, a multiply, a mean and the cast (each a pass over a [T, hc*embd] float32 tensor)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_E = 1024
NUM_WARPS = 4


@triton.jit
def _gate_mix_kernel(xn_ptr, g_ptr, out_ptr, embd, HC: tl.constexpr, BLOCK_E: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    e = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    mask = e < embd
    total = tl.zeros((BLOCK_E,), dtype=tl.float32)
    for c in tl.static_range(HC):
        offs = row * HC * embd + c * embd + e
        logit = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        total += tl.load(xn_ptr + offs, mask=mask, other=0.0) * (1.0 / (1.0 + tl.exp(-logit)))
    tl.store(out_ptr + row * embd + e, (total / HC).to(out_ptr.dtype.element_ty), mask=mask)


def gate_mix_triton(xn: torch.Tensor, gate_logits: torch.Tensor, dtype: torch.dtype = torch.float32,
                    block_e: int = BLOCK_E, num_warps: int = NUM_WARPS) -> torch.Tensor:
    """xn [T, hc, embd] float32, gate_logits [T, hc*embd] (contiguous) -> mixed [T, embd] in `dtype`."""
    n_rows, hc, embd = xn.shape
    mixed = torch.empty(n_rows, embd, dtype=dtype, device=xn.device)
    if n_rows:
        _gate_mix_kernel[(n_rows, triton.cdiv(embd, block_e))](xn.contiguous(), gate_logits.contiguous(), mixed, embd,
                                                               HC=hc, BLOCK_E=block_e, num_warps=num_warps)
    return mixed
