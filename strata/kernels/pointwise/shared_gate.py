"""The gated shared expert's combine in one launch: routed + shared * sigmoid(x . gate_weight) per token, each step
rounded to the activation dtype as `models.layers.add_gated_shared` computes it in torch (a matrix-vector product,
a sigmoid, a product and a sum there). Qwen3-Next (and Qwen2-MoE) do this in every MoE layer."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _shared_gate_kernel(routed_ptr, shared_ptr, x_ptr, gate_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    dtype = out_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(gate_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    logit = tl.sum(x * g, axis=0).to(dtype).to(tl.float32)  # torch's x @ w: float32 sums, rounded once
    gate = (1.0 / (1.0 + tl.exp(-logit))).to(dtype).to(tl.float32)
    shared = tl.load(shared_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    routed = tl.load(routed_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, (routed + (shared * gate).to(dtype).to(tl.float32)).to(dtype), mask=mask)


def shared_gate_triton(routed: torch.Tensor, shared: torch.Tensor, x: torch.Tensor,
                       gate_weight: torch.Tensor) -> torch.Tensor:
    """routed, shared, x [T, D] (bf16/fp16, one dtype), gate_weight [D] -> [T, D] contiguous."""
    n_cols = x.shape[-1]
    out = torch.empty_like(routed, memory_format=torch.contiguous_format)
    if out.numel():
        block = triton.next_power_of_2(n_cols)
        _shared_gate_kernel[(x.shape[0],)](routed.contiguous(), shared.contiguous(), x.contiguous(),
                                           gate_weight.contiguous(), out, n_cols, BLOCK=block,
                                           num_warps=min(8, max(1, block // 256)))
    return out
