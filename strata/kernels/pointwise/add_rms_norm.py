"""The residual add and the RMSNorm after it in one launch: h' = h + delta (rounded to h's dtype, the new residual)
and weight * (h' * rsqrt(mean(h'^2) + eps)), as `models.layers.add_rms_norm` computes them in torch (an add, then
the seven kernels of an RMSNorm there). Every layer of a decode step does this twice."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from strata.kernels.pdl import launch_options, pdl_start, pdl_wait


@triton.jit
def _add_rms_norm_kernel(h_ptr, d_ptr, w_ptr, res_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr,
                         PDL: tl.constexpr = 0):
    pdl_start(PDL)
    add_rms_norm_row(tl.program_id(0).to(tl.int64), h_ptr, d_ptr, w_ptr, res_ptr, out_ptr, n_cols, eps, BLOCK, PDL)


@triton.jit
def add_rms_norm_row(row, h_ptr, d_ptr, w_ptr, res_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr,
                     PDL: tl.constexpr):
    """Row `row` (`_add_rms_norm_kernel`'s body; also the last phase of the chained MoE launch,
    kernels/moe/chain_moe.py)."""
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    dtype = out_ptr.dtype.element_ty
    if PDL:  # the norm's weight: no kernel of the step writes it (kernels/pdl.py)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    pdl_wait(PDL)
    h = tl.load(h_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    d = tl.load(d_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    s = (h + d).to(dtype)  # the residual as torch keeps it: the sum rounded once
    tl.store(res_ptr + row * n_cols + cols, s, mask=mask)
    x = s.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    normed = (x * inv).to(dtype).to(tl.float32)  # torch rounds before the weight multiplies
    if not PDL:
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, (w * normed).to(dtype), mask=mask)


def add_rms_norm_triton(h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                        eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """h, delta [..., D] (bf16/fp16, one dtype), weight [D] -> (h + delta, its RMSNorm), both [..., D] contiguous."""
    n_cols = h.shape[-1]
    rows = h.reshape(-1, n_cols).contiguous()
    deltas = delta.reshape(-1, n_cols).contiguous()
    residual, out = torch.empty_like(rows), torch.empty_like(rows)
    if rows.shape[0]:
        block = triton.next_power_of_2(n_cols)
        _add_rms_norm_kernel[(rows.shape[0],)](rows, deltas, weight.contiguous(), residual, out, n_cols, eps,
                                              BLOCK=block, num_warps=min(8, max(1, block // 256)),
                                              **launch_options(rows))
    return residual.reshape(h.shape), out.reshape(h.shape)
