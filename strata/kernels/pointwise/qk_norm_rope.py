"""Qwen3's per-head query/key RMSNorm and the RoPE after it, for the queries and the keys of a step in one launch:
what `rms_norm_triton` then `rope_triton` compute, twice each (four launches in every attention layer), with the
same roundings: the norm rounded to the activation dtype before its weight multiplies and after, each RoPE product
rounded before the sum (`models.layers.qk_norm_rope` is the torch form)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _normed(x_ptr, w_ptr, at, inv, mask, dtype):
    """The RMSNorm output at offsets `at` of a row whose 1/rms is `inv`, as float32 holding a dtype value."""
    x = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + at, mask=mask, other=0.0).to(tl.float32)
    return (w * (x * inv).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)


@triton.jit
def _qk_norm_rope_kernel(q_ptr, k_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, q_out, k_out, n_heads, n_kv_heads,
                         q_token_stride, q_head_stride, eps, DIM: tl.constexpr, HALF: tl.constexpr,
                         BLOCK: tl.constexpr, HB: tl.constexpr, TAIL: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)  # query heads first, then the key heads
    is_q = head < n_heads
    if is_q:
        x_ptr = q_ptr + token * q_token_stride + head * q_head_stride
        w_ptr = qw_ptr
        out_ptr = q_out + (token * n_heads + head) * DIM
    else:
        x_ptr = k_ptr + (token * n_kv_heads + head - n_heads) * DIM
        w_ptr = kw_ptr
        out_ptr = k_out + (token * n_kv_heads + head - n_heads) * DIM
    dtype = q_out.dtype.element_ty
    cols = tl.arange(0, BLOCK)
    row = tl.load(x_ptr + cols, mask=cols < DIM, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(row * row, axis=0) / DIM + eps)
    i = tl.arange(0, HB)
    m = i < HALF
    lo = _normed(x_ptr, w_ptr, i, inv, m, dtype)
    hi = _normed(x_ptr, w_ptr, HALF + i, inv, m, dtype)
    cos_lo = tl.load(cos_ptr + token * (2 * HALF) + i, mask=m, other=0.0).to(tl.float32)
    cos_hi = tl.load(cos_ptr + token * (2 * HALF) + HALF + i, mask=m, other=0.0).to(tl.float32)
    sin_lo = tl.load(sin_ptr + token * (2 * HALF) + i, mask=m, other=0.0).to(tl.float32)
    sin_hi = tl.load(sin_ptr + token * (2 * HALF) + HALF + i, mask=m, other=0.0).to(tl.float32)
    # Each product rounded to the activation dtype, then the sum: torch's bf16 ops round after every op.
    a_lo = (lo * cos_lo).to(dtype).to(tl.float32)
    b_lo = (-hi * sin_lo).to(dtype).to(tl.float32)
    a_hi = (hi * cos_hi).to(dtype).to(tl.float32)
    b_hi = (lo * sin_hi).to(dtype).to(tl.float32)
    tl.store(out_ptr + i, (a_lo + b_lo).to(dtype), mask=m)
    tl.store(out_ptr + HALF + i, (a_hi + b_hi).to(dtype), mask=m)
    if TAIL > 0:  # the dims past the rotated ones: normed, not turned
        j = 2 * HALF + tl.arange(0, TAIL)
        keep = j < DIM
        tl.store(out_ptr + j, _normed(x_ptr, w_ptr, j, inv, keep, dtype).to(dtype), mask=keep)


def qk_norm_rope_triton(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                        eps: float, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, H, D] (each head's D values contiguous: a view split off a wider row is read in place), k [T, Hkv, D],
    norm weights [D], cos/sin [T, n_rot] (n_rot <= D, the leading dims turned), all of one dtype (bf16/fp16) ->
    (q, k) normed and turned, contiguous."""
    n_tokens, n_heads, dim = q.shape
    n_kv_heads, half = k.shape[1], cos.shape[-1] // 2
    if q.stride(-1) != 1:
        q = q.contiguous()
    k = k.contiguous()
    q_out, k_out = torch.empty(q.shape, dtype=q.dtype, device=q.device), torch.empty_like(k)
    if n_tokens:
        tail = triton.next_power_of_2(dim - 2 * half) if dim > 2 * half else 0
        _qk_norm_rope_kernel[(n_tokens, n_heads + n_kv_heads)](
            q, k, q_weight.contiguous(), k_weight.contiguous(), cos.contiguous(), sin.contiguous(), q_out, k_out,
            n_heads, n_kv_heads, q.stride(0), q.stride(1), eps, DIM=dim, HALF=half,
            BLOCK=triton.next_power_of_2(dim), HB=triton.next_power_of_2(half), TAIL=tail, num_warps=1)
    return q_out, k_out
