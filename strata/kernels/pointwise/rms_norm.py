"""RMSNorm in one launch: weight * (x * rsqrt(mean(x^2) + eps)), normalised in float32 and rounded to x's dtype
before the weight multiplies it, as `models.layers.rms_norm` does in torch (seven kernels there). Under STRATA_DP4A
it can also write the normed rows' int8 codes (`store_rounded_row`: layer 0's q/k/v input)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from strata.kernels.pdl import launch_options, pdl_start, pdl_wait
from strata.kernels.pointwise.add_rms_norm import rounded_options, store_rounded_row


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, n_cols, x_row_stride, eps, BLOCK: tl.constexpr, PDL: tl.constexpr = 0,
                     codes_ptr=None, scales_ptr=None, sums_ptr=None, QUANT: tl.constexpr = 0):
    pdl_start(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    if PDL:  # the norm's weight: no kernel of the step writes it (kernels/pdl.py)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    pdl_wait(PDL)
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    normed = (x * inv).to(out_ptr.dtype.element_ty).to(tl.float32)  # torch rounds before the weight multiplies
    if not PDL:
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = (w * normed).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * n_cols + cols, y, mask=mask)
    if QUANT:
        store_rounded_row(y, row, codes_ptr, scales_ptr, sums_ptr, n_cols, BLOCK)


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, rounded=None) -> torch.Tensor:
    """x [..., D] (bf16/fp16, any layout), weight [D] of x's dtype -> [..., D] in x's dtype, contiguous. `rounded`:
    (codes int8 [R, D], scales float32 [R, D/32], sums int32 [R, D/32]) the normed rows' quantize32 rounding is
    also written to (D a multiple of 32), or None."""
    n_cols = x.shape[-1]
    rows = x.reshape(-1, n_cols)  # a view where the rows are evenly spaced (a head split off a wider row)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    if rows.shape[0]:
        block = triton.next_power_of_2(n_cols)
        _rms_norm_kernel[(rows.shape[0],)](rows, weight.contiguous(), out, n_cols, rows.stride(0), eps,
                                          BLOCK=block, num_warps=min(8, max(1, block // 256)),
                                          **launch_options(rows), **rounded_options(rounded))
    return out.reshape(x.shape)
