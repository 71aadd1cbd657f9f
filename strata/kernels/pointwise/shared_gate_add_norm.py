"""The end of an MoE layer with a gated shared expert in one launch: routed + shared * sigmoid(x . gate) (as
`shared_gate_triton`), added to the residual and RMS-normed by the next block's weight (as `add_rms_norm_triton`),
each step rounded to the activation dtype as those two kernels round it, so the same bytes from one launch instead
of two (Qwen3-Next's MoE layers)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from strata.kernels.pdl import launch_options, pdl_start, pdl_wait


@triton.jit
def _shared_gate_add_norm_kernel(routed_ptr, shared_ptr, x_ptr, gate_ptr, h_ptr, nw_ptr, res_ptr, out_ptr, n_cols,
                                 eps, BLOCK: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_start(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    at = row * n_cols + cols
    dtype = out_ptr.dtype.element_ty
    if PDL:  # the shared expert's gate row: no kernel of the step writes it (kernels/pdl.py)
        g = tl.load(gate_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    pdl_wait(PDL)
    x = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
    if not PDL:
        g = tl.load(gate_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    logit = tl.sum(x * g, axis=0).to(dtype).to(tl.float32)  # as _shared_gate_kernel
    gate = (1.0 / (1.0 + tl.exp(-logit))).to(dtype).to(tl.float32)
    shared = tl.load(shared_ptr + at, mask=mask, other=0.0).to(tl.float32)
    routed = tl.load(routed_ptr + at, mask=mask, other=0.0).to(tl.float32)
    ffn = (routed + (shared * gate).to(dtype).to(tl.float32)).to(dtype)
    h = tl.load(h_ptr + at, mask=mask, other=0.0).to(tl.float32)
    s = (h + ffn.to(tl.float32)).to(dtype)  # as _add_rms_norm_kernel
    tl.store(res_ptr + at, s, mask=mask)
    y = s.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(y * y, axis=0) / n_cols + eps)
    normed = (y * inv).to(dtype).to(tl.float32)
    w = tl.load(nw_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + at, (w * normed).to(dtype), mask=mask)


def shared_gate_add_norm_triton(h: torch.Tensor, routed: torch.Tensor, shared: torch.Tensor, x: torch.Tensor,
                                gate_weight: torch.Tensor, norm_weight: torch.Tensor,
                                eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """h, routed, shared, x [T, D] (bf16/fp16, one dtype), gate_weight and norm_weight [D] -> (the new residual
    h + routed + shared * sigmoid(x . gate), its RMSNorm), both [T, D] contiguous."""
    n_cols = h.shape[-1]
    rows = h.contiguous()
    residual, out = torch.empty_like(rows), torch.empty_like(rows)
    if rows.shape[0]:
        block = triton.next_power_of_2(n_cols)
        # The warps of the two kernels it replaces: their sums' order, and so their bytes.
        _shared_gate_add_norm_kernel[(rows.shape[0],)](
            routed.contiguous(), shared.contiguous(), x.contiguous(), gate_weight.contiguous(), rows,
            norm_weight.contiguous(), residual, out, n_cols, eps, BLOCK=block, num_warps=min(8, max(1, block // 256)),
            **launch_options(rows))
    return residual, out
