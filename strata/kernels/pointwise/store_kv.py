"""One token's (or a verify window's) keys and values into a dense KV cache in one launch: each row cast to the
cache's dtype and stored at its position, K and V together, as `store_kv_ref` does in torch (two casts and two
index copies there: four kernels in every attention layer of a captured decode step)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, pos_ptr, keys_ptr, values_ptr, ROW: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    part = tl.program_id(1)  # which BLOCK-wide part of the row (all heads of a position are one row)
    cols = part * BLOCK + tl.arange(0, BLOCK)
    mask = cols < ROW
    cell = tl.load(pos_ptr + i).to(tl.int64)
    src = i.to(tl.int64) * ROW + cols
    dst = cell * ROW + cols
    dtype = keys_ptr.dtype.element_ty
    tl.store(keys_ptr + dst, tl.load(k_ptr + src, mask=mask).to(dtype), mask=mask)
    tl.store(values_ptr + dst, tl.load(v_ptr + src, mask=mask).to(dtype), mask=mask)


def store_kv_ref(keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> None:
    keys.index_copy_(0, positions, k.to(keys.dtype))
    values.index_copy_(0, positions, v.to(values.dtype))


def store_kv_triton(keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor, k: torch.Tensor,
                    v: torch.Tensor, block: int = 1024) -> None:
    """keys/values [cells, Hkv, D] (contiguous) get k/v [T, Hkv, D] at positions [T] (int32/int64)."""
    n, row = k.shape[0], k[0].numel() if k.shape[0] else 0
    if not (keys.is_contiguous() and values.is_contiguous()) or keys.shape[1:] != k.shape[1:]:
        raise ValueError(f"keys {tuple(keys.shape)} cannot take rows {tuple(k.shape)}")
    if n == 0:
        return
    block = min(block, triton.next_power_of_2(row))
    _store_kv_kernel[(n, triton.cdiv(row, block))](k.contiguous(), v.contiguous(), positions, keys, values,
                                                   ROW=row, BLOCK=block, num_warps=max(1, min(4, block // 256)))
