"""The GatedDeltaNet output gate in one launch: rms_norm(out, out_norm) * act(z) per value head, act SiLU
(Qwen3-Next) or sigmoid (qwen4exp). Rounded as the torch lines in models/gated_deltanet.py round: the norm as
`models.layers.rms_norm` (normalised in float32, rounded, times the weight, rounded), then the float32 product with
act(z) rounded once to the activation dtype. Torch takes a norm launch and five more for the gate."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

HEADS_PER_PROGRAM = 4  # the A3B shape's 32 heads of 128: 8 programs; a decode step is latency-bound
NUM_WARPS = 4


@triton.jit
def _out_gate_kernel(o_ptr, w_ptr, z_ptr, out_ptr, n_rows, dim, o_stride, z_stride, eps,
                     SIGMOID: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < dim)
    rows = rows.to(tl.int64)
    dtype = out_ptr.dtype.element_ty
    o = tl.load(o_ptr + rows[:, None] * o_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(o * o, axis=1) / dim + eps)
    w = tl.load(w_ptr + cols, mask=cols < dim, other=0.0).to(tl.float32)
    normed = (w[None, :] * (o * inv[:, None]).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    z = tl.load(z_ptr + rows[:, None] * z_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    gate = 1.0 / (1.0 + tl.exp(-z))
    if not SIGMOID:
        gate = z * gate
    tl.store(out_ptr + rows[:, None] * dim + cols[None, :], (normed * gate).to(dtype), mask=mask)


def out_gate_triton(out: torch.Tensor, norm_weight: torch.Tensor, z: torch.Tensor, eps: float, sigmoid: bool,
                    heads_per_program: int = HEADS_PER_PROGRAM, num_warps: int = NUM_WARPS) -> torch.Tensor:
    """out, z [..., Dv] (bf16/fp16, one dtype), norm_weight [Dv] -> [..., Dv] contiguous in out's dtype."""
    dim = out.shape[-1]
    o_rows, z_rows = out.reshape(-1, dim), z.reshape(-1, dim)
    o_rows = o_rows if o_rows.stride(-1) == 1 else o_rows.contiguous()
    z_rows = z_rows if z_rows.stride(-1) == 1 else z_rows.contiguous()
    result = torch.empty(o_rows.shape, dtype=out.dtype, device=out.device)
    n_rows = o_rows.shape[0]
    if n_rows:
        _out_gate_kernel[(triton.cdiv(n_rows, heads_per_program),)](
            o_rows, norm_weight.contiguous(), z_rows, result, n_rows, dim, o_rows.stride(0), z_rows.stride(0), eps,
            SIGMOID=sigmoid, ROWS=heads_per_program, BLOCK=triton.next_power_of_2(dim), num_warps=num_warps)
    return result.reshape(out.shape)
