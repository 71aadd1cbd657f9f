"""The residual add and the RMSNorm after it in one launch: h' = h + delta (rounded to h's dtype, the new residual)
and weight * (h' * rsqrt(mean(h'^2) + eps)), as `models.layers.add_rms_norm` computes them in torch (an add, then
the seven kernels of an RMSNorm there). Every layer of a decode step does this twice."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from strata.kernels.moe.quantize32 import round_groups
from strata.kernels.pdl import launch_options, pdl_start, pdl_wait


@triton.jit
def _add_rms_norm_kernel(h_ptr, d_ptr, w_ptr, res_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr,
                         PDL: tl.constexpr = 0, codes_ptr=None, scales_ptr=None, sums_ptr=None,
                         QUANT: tl.constexpr = 0):
    pdl_start(PDL)
    add_rms_norm_row(tl.program_id(0).to(tl.int64), h_ptr, d_ptr, w_ptr, res_ptr, out_ptr, n_cols, eps, BLOCK, PDL,
                     codes_ptr, scales_ptr, sums_ptr, QUANT)


@triton.jit
def add_rms_norm_row(row, h_ptr, d_ptr, w_ptr, res_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr,
                     PDL: tl.constexpr, codes_ptr=None, scales_ptr=None, sums_ptr=None, QUANT: tl.constexpr = 0):
    """Row `row` (`_add_rms_norm_kernel`'s body; also the last phase of the chained MoE launch,
    kernels/moe/chain_moe.py). QUANT (STRATA_DP4A): the normed row's int8 codes, scales and code sums too
    (`store_rounded_row`)."""
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
    y = (w * normed).to(dtype)
    tl.store(out_ptr + row * n_cols + cols, y, mask=mask)
    if QUANT:
        store_rounded_row(y, row, codes_ptr, scales_ptr, sums_ptr, n_cols, BLOCK)


@triton.jit
def store_rounded_row(y, row, codes_ptr, scales_ptr, sums_ptr, n_cols, BLOCK: tl.constexpr):
    """The row y [BLOCK] (n_cols of them real, a multiple of 32; zeros past them) rounded as `quantize32` rounds it:
    int8 codes [.., n_cols], float32 scales and int32 code sums [.., n_cols / 32] at row `row` (the dp4a GEMVs'
    activation, kernels/moe/dp4a_gemv.py). Exact only in a launch without FMA contraction (quantize32's kernel)."""
    cols = tl.arange(0, BLOCK)
    groups = tl.arange(0, BLOCK // 32)
    codes, scales, sums = round_groups(tl.reshape(y.to(tl.float32), (1, BLOCK)), 1, BLOCK)
    tl.store(codes_ptr + row * n_cols + cols[None, :], codes, mask=cols[None, :] < n_cols)
    gm = groups[None, :] < n_cols // 32
    tl.store(scales_ptr + row * (n_cols // 32) + groups[None, :], scales, mask=gm)
    tl.store(sums_ptr + row * (n_cols // 32) + groups[None, :], sums, mask=gm)


def rounded_options(rounded) -> dict:
    """A norm launch's keywords for `rounded` (codes, scales, sums of its normed rows; None: none, the launch as
    before): the pointers, QUANT and no FMA contraction, so that the codes are quantize32's bytes."""
    if rounded is None:
        return {}
    codes, scales, sums = rounded
    return {"codes_ptr": codes, "scales_ptr": scales, "sums_ptr": sums, "QUANT": 1, "enable_fp_fusion": False}


def add_rms_norm_triton(h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                        eps: float, rounded=None) -> tuple[torch.Tensor, torch.Tensor]:
    """h, delta [..., D] (bf16/fp16, one dtype), weight [D] -> (h + delta, its RMSNorm), both [..., D] contiguous.
    `rounded`: (codes int8 [R, D], scales float32 [R, D/32], sums int32 [R, D/32]) the normed rows' quantize32
    rounding is also written to (D a multiple of 32), or None."""
    n_cols = h.shape[-1]
    rows = h.reshape(-1, n_cols).contiguous()
    deltas = delta.reshape(-1, n_cols).contiguous()
    residual, out = torch.empty_like(rows), torch.empty_like(rows)
    if rows.shape[0]:
        block = triton.next_power_of_2(n_cols)
        _add_rms_norm_kernel[(rows.shape[0],)](rows, deltas, weight.contiguous(), residual, out, n_cols, eps,
                                              BLOCK=block, num_warps=min(8, max(1, block // 256)),
                                              **launch_options(rows), **rounded_options(rounded))
    return residual.reshape(h.shape), out.reshape(h.shape)
