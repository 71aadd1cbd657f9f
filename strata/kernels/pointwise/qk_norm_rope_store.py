"""Qwen3's q/k RMSNorm + RoPE and the KV cache write in one launch: what `qk_norm_rope_triton` then
`store_kv_triton` (a dense cache) or `append_kv_triton` (the paged pool, int8 or fp16) compute, with the same
roundings and the same sums, so the same bytes: the queries turned into `q_out`, the keys turned and stored at
their cells (cast to the cache's dtype, or quantized), the values stored beside them. The decode step's attention
then reads this step's keys from the cache, so the turned keys need no tensor of their own.

Each element is computed on its own (its RoPE partner loaded beside it), so a key row comes out in the [groups, 64]
shape the int8 quantizer takes; the norm's sum is the 1-D one-warp sum of `qk_norm_rope_triton`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from strata.kernels.attention.kv_int8 import _quantize_store
from strata.kernels.attention.paged import GROUP, PAGE, PagedKV
from strata.kernels.pdl import launch_options, pdl_start, pdl_wait
from strata.kernels.pointwise.qk_norm_rope import _normed


@triton.jit
def _turned(x_ptr, w_ptr, cos_ptr, sin_ptr, j, inv, DIM: tl.constexpr, HALF: tl.constexpr, dtype):
    """The normed and turned row at offsets `j` (any shape) as float32 holding dtype values: `qk_norm_rope`'s
    lo/hi products, each rounded, then their rounded sum; the dims past 2 * HALF normed only."""
    n = _normed(x_ptr, w_ptr, j, inv, j < DIM, dtype)
    turned = j < 2 * HALF
    low = j < HALF
    partner = _normed(x_ptr, w_ptr, tl.where(low, j + HALF, j - HALF), inv, turned, dtype)
    c = tl.load(cos_ptr + j, mask=turned, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + j, mask=turned, other=0.0).to(tl.float32)
    a = (n * c).to(dtype).to(tl.float32)
    b = (tl.where(low, -partner, partner) * s).to(dtype).to(tl.float32)  # -hi * sin for the low half
    return tl.where(turned, (a + b).to(dtype).to(tl.float32), n)


@triton.jit
def _qk_norm_rope_store_kernel(q_ptr, k_ptr, v_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, q_out, pos_ptr, page_table_ptr,
                               kc_ptr, vc_ptr, ks_ptr, vs_ptr, n_heads, n_kv_heads, q_token_stride, q_head_stride,
                               k_token_stride, v_token_stride, eps, DIM: tl.constexpr, HALF: tl.constexpr,
                               BLOCK: tl.constexpr, PAGED: tl.constexpr, INT8: tl.constexpr, PDL: tl.constexpr = 0):
    pdl_start(PDL)
    pdl_wait(PDL)  # every read is of this step's rows, positions and cos/sin but the two small norm weights
    qk_norm_rope_store_item(tl.program_id(0).to(tl.int64), tl.program_id(1), q_ptr, k_ptr, v_ptr, qw_ptr, kw_ptr,
                            cos_ptr, sin_ptr, q_out, pos_ptr, page_table_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, n_heads,
                            n_kv_heads, q_token_stride, q_head_stride, k_token_stride, v_token_stride, eps, DIM, HALF,
                            BLOCK, PAGED, INT8)


@triton.jit
def qk_norm_rope_store_item(token, head, q_ptr, k_ptr, v_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, q_out, pos_ptr,
                            page_table_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, n_heads, n_kv_heads, q_token_stride,
                            q_head_stride, k_token_stride, v_token_stride, eps, DIM: tl.constexpr,
                            HALF: tl.constexpr, BLOCK: tl.constexpr, PAGED: tl.constexpr, INT8: tl.constexpr):
    """Head `head` (query heads first, then the key heads) of token `token` (int64): `_qk_norm_rope_store_kernel`'s
    body, also the store phase of the chained q/k/v launch (kernels/pointwise/chain_qkv_store.py)."""
    dtype = q_out.dtype.element_ty
    cs = token * (2 * HALF)
    if head < n_heads:
        x_ptr = q_ptr + token * q_token_stride + head * q_head_stride
        w_ptr = qw_ptr
    else:
        x_ptr = k_ptr + token * k_token_stride + (head - n_heads) * DIM
        w_ptr = kw_ptr
    cols = tl.arange(0, BLOCK)
    row = tl.load(x_ptr + cols, mask=cols < DIM, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(row * row, axis=0) / DIM + eps)  # as qk_norm_rope_triton: the same sum
    if head < n_heads:
        out = _turned(x_ptr, w_ptr, cos_ptr + cs, sin_ptr + cs, cols, inv, DIM, HALF, dtype)
        tl.store(q_out + (token * n_heads + head) * DIM + cols, out.to(dtype), mask=cols < DIM)
    else:
        kvh = head - n_heads
        store_key_value(x_ptr, w_ptr, cos_ptr + cs, sin_ptr + cs, inv, v_ptr + token * v_token_stride + kvh * DIM,
                        tl.load(pos_ptr + token), kvh, n_kv_heads, page_table_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr,
                        DIM, HALF, BLOCK, PAGED, INT8, dtype)


@triton.jit
def store_key_value(x_ptr, w_ptr, cos_ptr, sin_ptr, inv, v_row, cell, kvh, n_kv_heads, page_table_ptr, kc_ptr,
                    vc_ptr, ks_ptr, vs_ptr, DIM: tl.constexpr, HALF: tl.constexpr, BLOCK: tl.constexpr,
                    PAGED: tl.constexpr, INT8: tl.constexpr, dtype):
    """KV head kvh's new key (the row at x_ptr whose 1/rms is `inv`, normed and turned) and its value row at v_row
    into the cache at `cell`: cast to a dense cache's dtype, or into the paged pool (int8 codes and scales a 64
    values, or fp16). Also the store of STRATA_DECODE_TURN's attention launch (kernels/attention/decode_turn.py)."""
    cols = tl.arange(0, BLOCK)
    # The value row loaded first: after the key's store the compiler may not move it up (the pointers might alias),
    # and its latency would follow the key's.
    if PAGED:
        j = tl.arange(0, DIM // 64)[:, None] * 64 + tl.arange(0, 64)[None, :]  # the quantizer's groups
        value = tl.load(v_row + j).to(tl.float32)
    else:
        value = tl.load(v_row + cols, mask=cols < DIM)
    cell = cell.to(tl.int64)
    if PAGED:
        page = tl.load(page_table_ptr + cell // 4).to(tl.int64)
        dst = (page * n_kv_heads + kvh) * 4 + cell % 4
        key = _turned(x_ptr, w_ptr, cos_ptr, sin_ptr, j, inv, DIM, HALF, dtype)
        _quantize_store(key, kc_ptr, ks_ptr, dst, 64, DIM // 64, INT8)
        _quantize_store(value, vc_ptr, vs_ptr, dst, 64, DIM // 64, INT8)
    else:
        key = _turned(x_ptr, w_ptr, cos_ptr, sin_ptr, cols, inv, DIM, HALF, dtype)
        dst = (cell * n_kv_heads + kvh) * DIM + cols
        cache = kc_ptr.dtype.element_ty
        tl.store(kc_ptr + dst, key.to(dtype).to(cache), mask=cols < DIM)
        tl.store(vc_ptr + dst, value.to(cache), mask=cols < DIM)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D] readable with a token stride (heads D apart, values contiguous), else a contiguous copy."""
    return x if x.stride(2) == 1 and x.stride(1) == x.shape[2] else x.contiguous()


def store_args(q, k, v, q_weight, k_weight, eps, cos, sin, positions, page_table, caches, paged: bool,
               int8: bool) -> tuple[tuple, dict, torch.Tensor]:
    """(the kernel's arguments from q_ptr to eps, its constexprs, q_out): what `_launch` passes, for the chained
    launch too."""
    n_tokens, n_heads, dim = q.shape
    n_kv_heads, half = k.shape[1], cos.shape[-1] // 2
    if q.stride(-1) != 1:
        q = q.contiguous()
    k, v = _rows(k), _rows(v)
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    args = (q, k, v, q_weight.contiguous(), k_weight.contiguous(), cos.contiguous(), sin.contiguous(), q_out,
            positions.to(torch.int32), page_table, *caches, n_heads, n_kv_heads, q.stride(0), q.stride(1),
            k.stride(0), v.stride(0), eps)
    return args, dict(DIM=dim, HALF=half, BLOCK=triton.next_power_of_2(dim), PAGED=paged, INT8=int8), q_out


def _launch(q, k, v, q_weight, k_weight, eps, cos, sin, positions, page_table, caches, paged: bool,
            int8: bool) -> torch.Tensor:
    args, constants, q_out = store_args(q, k, v, q_weight, k_weight, eps, cos, sin, positions, page_table, caches,
                                        paged, int8)
    if q.shape[0]:
        _qk_norm_rope_store_kernel[(q.shape[0], q.shape[1] + k.shape[1])](*args, **constants, num_warps=1,
                                                                          **launch_options(q))
    return q_out


def dense_target(kv_shape, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> tuple:
    """A dense cache as the kernel's store target (positions, page table, caches, paged, int8) for key rows of
    kv_shape [Hkv, D]."""
    if not (keys.is_contiguous() and values.is_contiguous()) or keys.shape[1:] != tuple(kv_shape):
        raise ValueError(f"keys {tuple(keys.shape)} cannot take rows {tuple(kv_shape)}")
    # The page table and the scales are unused in the dense form: any valid pointer stands in for them.
    return positions, positions, (keys, values, keys, values), False, False


def paged_target(kv_shape, pool: PagedKV, page_table: torch.Tensor, cells: torch.Tensor) -> tuple:
    """A paged pool (int8 codes and scales, or fp16) as the kernel's store target at logical `cells` [T]."""
    n_kv_heads, dim = kv_shape
    if n_kv_heads != pool.n_kv_heads or dim != pool.head_dim or pool.head_dim % GROUP or PAGE != 4:
        raise ValueError(f"keys {tuple(kv_shape)} do not fit a pool of {pool.n_kv_heads} KV heads x {pool.head_dim}")
    scales = (pool.k_scale, pool.v_scale) if pool.int8 else (pool.k, pool.v)  # unused pointers for fp16
    return cells, page_table.to(torch.int32), (pool.k, pool.v, *scales), True, pool.int8


def qk_norm_rope_store_dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_weight: torch.Tensor,
                             k_weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor,
                             keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """q [T, H, D], k and v [T, Hkv, D] (bf16/fp16; q and k as `qk_norm_rope_triton` takes them), a dense cache's
    keys/values [cells, Hkv, D] (contiguous, any float dtype), positions [T] -> q normed and turned [T, H, D]; the
    turned keys and the values written at the positions' cells."""
    return _launch(q, k, v, q_weight, k_weight, eps, cos, sin, *dense_target(k.shape[1:], keys, values, positions))


def qk_norm_rope_store_paged(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_weight: torch.Tensor,
                             k_weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor, pool: PagedKV,
                             page_table: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
    """As `qk_norm_rope_store_dense` into a paged pool (int8 codes and scales, or fp16) at logical `cells` [T]."""
    return _launch(q, k, v, q_weight, k_weight, eps, cos, sin, *paged_target(k.shape[1:], pool, page_table, cells))
