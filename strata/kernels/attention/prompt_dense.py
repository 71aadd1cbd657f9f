"""Selected-cells attention over a dense fp16 KV cache (engine/kv.KVCache): each query reads only its cells.

The dense cache is keys/values [S, Hkv, D] (cell c of KV head h at element `c * stride_cell + h * stride_head`),
not a paged pool, so the paged kernels' row formula does not apply; this kernel reads the cache in place. A prompt
chunk's queries come with a selection (ids [T, W] ascending, width [T]: QSA's indexer or `--qsa quest`) and the
chunk's own keys are already stored (KVCache.attend writes first).

The math is the prompt kernels' (prompt_v1.py), for fp16 values instead of int8 codes:
- q: per row (query head) `max|q| < 2^qe`, `x = q * 2^(14 - qe)` split into fp16 hi + lo (about 22 bits); the fp16
  keys enter the dots exactly, so `s = (hi . K + lo . K) * 2^(qe - 14) * scale_log2` carries q's fp32 value to
  about 2^-22 (fp32 sums on the tensor cores).
- online softmax in base 2 (prompt_parts.softmax_step_masked); p' = e * 2^14 (e <= 1) split into fp16 hi + lo
  against the exact fp16 V, the accumulator kept times 2^14 and divided once at the end.
- Blocked as prompt_blocks.py: a program's rows are a block of queries x query heads of one KV head; with more
  than one query the block's selections are merged (shared_cells) and each row attends only its query's cells.
Tunables: a `PromptConfig` (queries, heads, chunk, warps, stages, splits: split-K over a block's cells, maxreg);
`STRATA_PA_CONFIG` does not apply here (it names the int8 kernels' tunables). Reference: `dense_selected_ref`
(float64 for parity).
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
import triton
import triton.language as tl

from strata.kernels.attention.decode import merge_splits
from strata.kernels.attention.prompt_blocks import (MAX_GRID_Y, PromptConfig, block_rows, cell_attend, shared_cells,
                                                     split_range)
from strata.kernels.attention.prompt_parts import LOG2E, softmax_step_masked
from strata.kernels.attention.prompt_v1 import q_exponent, split_hilo

# H200 sweep (session 8, `bench qsa-attn --sweep`, 2,419 queries of 24/2 heads x 256 at 4K and 32K cells): one
# query's KV group a program, 32 cells a step, 4 warps, 3 stages, 128 registers a thread: 2.42-2.50 ms, 1.02-1.03x
# the floor, 1.49x the first default (8 warps, 3.65 ms); the dense-mask SDPA it replaces took 9.3 / 68.2 ms.
DEFAULT = PromptConfig(queries=1, heads=0, chunk=32, warps=4, stages=3, maxreg=128)
# Decode steps and verify windows: each query its own programs, whatever DEFAULT is, so a row's bytes do not depend
# on the launch's other rows (a window's rows are its steps' bytes); its 2,051 cells split 16 ways (a step's 2 KV
# heads alone would leave all but 2 SMs idle), the partials merged in order (decode.merge_splits). Measured as is
# (8 warps): 123-131 us a step at 4K / 32K against 593 / 2,568 us through the old path's span copy and mask.
ROW_EXACT = PromptConfig(queries=1, heads=0, chunk=32, warps=8, stages=3, splits=16)
# Error bound vs float64, over the output scale: the prompt kernels' max(4 x the fp32 reference's, 1e-6) with a
# floor of 2e-6, the fp32 tensor-core sums' own (~2^-19: 1.2-1.6e-6 measured where the torch fp32 reference
# reached 3.3e-7); the bf16 path it replaces is off by 3.4e-3.
ERROR_FLOOR = 2e-6
P_SCALE = tl.constexpr(16384.0)  # e <= 1 scaled to 2^14 before its hi + lo split: lo stays clear of fp16's subnormals


def dense_kernel_applies(keys: torch.Tensor, n_heads: int) -> bool:
    """Whether the kernel reads this cache: its shape (`dense_kernel_shape`) and unit stride along D."""
    _, n_kv_heads, dim = keys.shape
    return dense_kernel_shape(keys.dtype, dim, n_heads, n_kv_heads) and keys.stride(2) == 1


def dense_kernel_shape(dtype: torch.dtype, head_dim: int, n_heads: int, n_kv_heads: int) -> bool:
    """Whether the kernel takes a cache of this dtype and shape: fp16 values, head_dim a power of two from 16, whole
    groups of at most 64 query heads a key head."""
    return (dtype == torch.float16 and head_dim >= 16 and head_dim & (head_dim - 1) == 0
            and n_heads % n_kv_heads == 0 and n_heads // n_kv_heads <= 64)


@triton.jit
def _dense_selected_kernel(q_ptr, out_ptr, parts_ptr, ml_ptr, cells_ptr, members_ptr, count_ptr, k_ptr, v_ptr,
                           block0, n_q, row_len, n_kv_heads, stride_cell, stride_head, scale_log2,
                           G: tl.constexpr, HP: tl.constexpr, BQ: tl.constexpr, BM: tl.constexpr,
                           CH: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr):
    blk, kvh, slot, head, ok = block_rows(block0, n_q, n_kv_heads, G, HP, BQ, BM)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + head[:, None] * D + d[None, :], mask=ok[:, None], other=0.0)  # [BM, D] fp32
    up, down = q_exponent(tl.max(tl.abs(q), axis=1))  # per row
    hi, lo = split_hilo(q * up[:, None])
    qdown = scale_log2 * down
    count = tl.load(count_ptr + blk)
    cells_row = cells_ptr + blk.to(tl.int64) * row_len
    members_row = members_ptr + blk.to(tl.int64) * row_len
    head_off = kvh.to(tl.int64) * stride_head
    m = tl.full((BM,), float("-inf"), tl.float32)
    l = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, D), tl.float32)
    c_lo, c_hi = split_range(count, CH, SPLITS)
    for c0 in range(c_lo, c_hi, CH):
        j = c0 + tl.arange(0, CH)
        valid = j < count
        base = tl.load(cells_row + j, mask=valid, other=0).to(tl.int64) * stride_cell + head_off  # [CH]
        attend = cell_attend(members_row, c0, valid, slot, CH, BQ)
        k = tl.load(k_ptr + base[None, :] + d[:, None], mask=valid[None, :], other=0.0)  # [D, CH] fp16
        s = tl.dot(lo, k, tl.dot(hi, k)) * qdown[:, None]
        e, alpha, m, l = softmax_step_masked(s, attend, m, l)
        v = tl.load(v_ptr + base[:, None] + d[None, :], mask=valid[:, None], other=0.0)  # [CH, D] fp16
        p_hi, p_lo = split_hilo(e * P_SCALE)
        acc = acc * alpha[:, None] + tl.dot(p_lo, v, tl.dot(p_hi, v))
    if SPLITS == 1:
        out = tl.where(l[:, None] > 0, acc / tl.where(l > 0, l * P_SCALE, 1.0)[:, None], 0.0)
        tl.store(out_ptr + head[:, None] * D + d[None, :], out, mask=ok[:, None])
    else:  # this split's unscaled partials (acc back to p's own scale: a power of two, exact) for merge_splits
        part = head * SPLITS + tl.program_id(2)
        tl.store(parts_ptr + part[:, None] * D + d[None, :], acc * (1.0 / P_SCALE), mask=ok[:, None])
        tl.store(ml_ptr + part * 2, m, mask=ok)
        tl.store(ml_ptr + part * 2 + 1, l, mask=ok)


def dense_selected_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, ids: torch.Tensor,
                             width: torch.Tensor, sm_scale: float | None = None,
                             config: PromptConfig | None = None) -> torch.Tensor:
    """Attention [T, H, D] fp32 of q [T, H, D] over the cells `ids[:, :width]` of the fp16 cache keys/values
    [S, Hkv, D] (any S holding every selected cell); 0 where a selection is empty. Head h reads KV head
    h // (H / Hkv). No host sync (a block of one query reads its selection as given)."""
    n_q, n_heads, dim = q.shape
    n_kv_heads = keys.shape[1]
    if not dense_kernel_applies(keys, n_heads) or values.stride() != keys.stride() or keys.shape[2] != dim:
        raise ValueError(f"q {tuple(q.shape)}, keys {tuple(keys.shape)} {keys.dtype}: the dense selected kernel "
                         "reads fp16 caches of head_dim a power of two >= 16, K and V alike")
    if ids.shape[0] != n_q or tuple(width.shape) != (n_q,):
        raise ValueError("ids must be [T, W] and width [T]")
    group = n_heads // n_kv_heads
    config = (config or DEFAULT).resolve(group)
    if n_q < config.queries:
        config = replace(config, queries=max(1, n_q))
    out = torch.empty(n_q, n_heads, dim, dtype=torch.float32, device=q.device)
    if n_q == 0:
        return out
    ids, width = ids.to(torch.int32).contiguous(), width.to(torch.int32).contiguous()
    if config.queries == 1:
        cells, members, count = ids, ids, width  # members unused
    else:
        cells, members, count = shared_cells(ids, width, config.queries)
    scale = 1 / math.sqrt(dim) if sm_scale is None else sm_scale
    programs, blocks, splits = n_kv_heads * (group // config.heads), count.shape[0], config.splits
    parts = ml = out  # unused with one split
    if splits > 1:
        parts = torch.empty(n_q * n_heads, splits, dim, dtype=torch.float32, device=q.device)
        ml = torch.empty(n_q * n_heads, splits, 2, dtype=torch.float32, device=q.device)
    options = {"maxnreg": config.maxreg} if config.maxreg else {}
    qf = q.float().contiguous()
    for block0 in range(0, blocks, MAX_GRID_Y):  # a grid's second dimension stops at 65,535
        _dense_selected_kernel[(programs, min(MAX_GRID_Y, blocks - block0), splits)](
            qf, out, parts, ml, cells, members, count, keys, values, block0, n_q, cells.shape[1], n_kv_heads,
            keys.stride(0), keys.stride(1), scale * LOG2E, G=group, HP=config.heads, BQ=config.queries,
            BM=config.rows(), CH=config.chunk, D=dim, SPLITS=splits, num_warps=config.warps,
            num_stages=config.stages, **options)
    if splits > 1:
        merge_splits(parts, ml, out.view(n_q * n_heads, dim))
    return out


def dense_selected_ref(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, ids: torch.Tensor,
                       width: torch.Tensor, sm_scale: float | None = None,
                       dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The same attention in `dtype` by gathering each query's cells (float64 for parity): [T, H, D]."""
    n_q, n_heads, dim = q.shape
    n_kv_heads = keys.shape[1]
    group = n_heads // n_kv_heads
    scale = 1 / math.sqrt(dim) if sm_scale is None else sm_scale
    valid = torch.arange(ids.shape[1], device=q.device)[None] < width.to(q.device)[:, None]
    cells = torch.where(valid, ids.to(q.device).long(), 0)
    k, v = keys[cells].to(dtype), values[cells].to(dtype)  # [T, W, Hkv, D]
    qg = q.to(dtype).view(n_q, n_kv_heads, group, dim)
    s = torch.einsum("tkgd,twkd->tkgw", qg, k) * scale
    p = torch.softmax(s.masked_fill(~valid[:, None, None], float("-inf")), -1).nan_to_num(0.0)
    return torch.einsum("tkgw,twkd->tkgd", p, v).reshape(n_q, n_heads, dim)
