"""Neox RoPE in one launch: x * cos + rotate_half(x) * sin on the first n_rot dims of each head (the rest passed
through: Qwen3-Next's partial rotary), each product rounded to x's dtype before the sum, as
`models.layers.Rope.apply` computes it in torch (a cat, a negation, two products, a sum and another cat there)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rope_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, n_heads, DIM: tl.constexpr, HALF: tl.constexpr,
                 BLOCK: tl.constexpr, TAIL: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    i = tl.arange(0, BLOCK)
    mask = i < HALF
    base = (token * n_heads + head) * DIM
    lo = tl.load(x_ptr + base + i, mask=mask, other=0.0)
    hi = tl.load(x_ptr + base + HALF + i, mask=mask, other=0.0)
    cos_lo = tl.load(cos_ptr + token * (2 * HALF) + i, mask=mask, other=0.0)
    cos_hi = tl.load(cos_ptr + token * (2 * HALF) + HALF + i, mask=mask, other=0.0)
    sin_lo = tl.load(sin_ptr + token * (2 * HALF) + i, mask=mask, other=0.0)
    sin_hi = tl.load(sin_ptr + token * (2 * HALF) + HALF + i, mask=mask, other=0.0)
    dtype = out_ptr.dtype.element_ty
    # Each product rounded to the activation dtype, then the sum: torch's bf16 ops round after every op.
    a_lo = (lo.to(tl.float32) * cos_lo.to(tl.float32)).to(dtype).to(tl.float32)
    b_lo = (-hi.to(tl.float32) * sin_lo.to(tl.float32)).to(dtype).to(tl.float32)
    a_hi = (hi.to(tl.float32) * cos_hi.to(tl.float32)).to(dtype).to(tl.float32)
    b_hi = (lo.to(tl.float32) * sin_hi.to(tl.float32)).to(dtype).to(tl.float32)
    tl.store(out_ptr + base + i, (a_lo + b_lo).to(dtype), mask=mask)
    tl.store(out_ptr + base + HALF + i, (a_hi + b_hi).to(dtype), mask=mask)
    if TAIL > 0:  # the dims past n_rot, unrotated
        j = tl.arange(0, TAIL)
        keep = 2 * HALF + j < DIM
        tl.store(out_ptr + base + 2 * HALF + j, tl.load(x_ptr + base + 2 * HALF + j, mask=keep), mask=keep)


def rope_triton(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_rot: int | None = None) -> torch.Tensor:
    """x [T, H, D] (bf16/fp16), cos/sin [T, n_rot] of x's dtype -> [T, H, D] contiguous, the first n_rot (default
    D) dims of each head rotated."""
    n_tokens, n_heads, dim = x.shape
    n_rot = dim if n_rot is None else n_rot
    x = x.contiguous()
    out = torch.empty_like(x)
    if x.numel():
        half = n_rot // 2
        tail = triton.next_power_of_2(dim - n_rot) if dim > n_rot else 0
        _rope_kernel[(n_tokens, n_heads)](x, cos.contiguous(), sin.contiguous(), out, n_heads, DIM=dim, HALF=half,
                                          BLOCK=triton.next_power_of_2(half), TAIL=tail, num_warps=1)
    return out
