"""A step's RoPE cos and sin rows in one launch, as `models.layers.Rope.cos_sin` computes them in torch (positions to
float, times the inverse frequencies, the two halves concatenated, cos, sin, each rounded to the dtype: seven
launches, ~9 us of an A3B decode step's critical path on an H200). The angle is the same float32 product; cos and
sin are Triton's float32 functions (full-range argument reduction, no approximate instructions), which may sit an
ulp of float32 from torch's before the rounding to the dtype (tests/kernels/pointwise/test_step_inputs.py)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rope_cos_sin_kernel(pos_ptr, inv_freq_ptr, cos_ptr, sin_ptr, HALF: tl.constexpr, HB: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, HB)
    live = i < HALF
    angle = tl.load(pos_ptr + t).to(tl.float32) * tl.load(inv_freq_ptr + i, mask=live, other=0.0)
    c = tl.cos(angle).to(cos_ptr.dtype.element_ty)
    s = tl.sin(angle).to(sin_ptr.dtype.element_ty)
    at = t * 2 * HALF + i
    for half in tl.static_range(2):  # the two halves of a row rotate with the same angles
        tl.store(cos_ptr + at + half * HALF, c, mask=live)
        tl.store(sin_ptr + at + half * HALF, s, mask=live)


def rope_cos_sin_triton(positions: torch.Tensor, inv_freq: torch.Tensor,
                        dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [T] (integers), inv_freq [R/2] float32 -> (cos, sin) [T, R] of dtype."""
    n, half = positions.numel(), inv_freq.numel()
    cos = torch.empty(n, 2 * half, dtype=dtype, device=positions.device)
    sin = torch.empty_like(cos)
    if n:
        _rope_cos_sin_kernel[(n,)](positions.reshape(-1), inv_freq.contiguous(), cos, sin, HALF=half,
                                   HB=triton.next_power_of_2(half), num_warps=1)
    return cos, sin
