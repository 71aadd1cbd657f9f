"""Pieces shared by the prompt and decode attention kernels: the chunk's pool rows and one online-softmax step.

Scores are in base 2 (`scale_log2 = sm_scale * log2(e)`): per row and chunk, `m_new = max(m, max s)`,
`e = exp2(s - m_new)` (invalid cells give 0), `alpha = exp2(m - m_new)` (0 while m = -inf), `l = l * alpha + sum e`;
the caller rescales its accumulator by alpha and adds the chunk's e . V.
"""

from __future__ import annotations

import math

import torch

import triton
import triton.language as tl

import strata.kernels  # noqa: F401  (the interpreter switch, before Triton compiles anything)

CHUNK = 32  # cells per step of the prompt kernels
LOG2E = 1 / math.log(2)


@triton.jit
def chunk_rows(ids_ptr, page_table_ptr, c0, width, kvh, n_kv_heads, CH: tl.constexpr, IN_ORDER: tl.constexpr = False):
    """Pool rows (int64) of selected cells `c0 .. c0 + CH` of one query, and which of them are valid. IN_ORDER: the
    ids are 0, 1, 2, ... (every cell, no selection): cell j is j, one dependent load fewer."""
    j = c0 + tl.arange(0, CH)
    valid = j < width
    if IN_ORDER:
        cell = tl.where(valid, j, 0)
    else:
        cell = tl.load(ids_ptr + j, mask=valid, other=0)
    page = tl.load(page_table_ptr + cell // 4, mask=valid, other=0).to(tl.int64)
    return (page * n_kv_heads + kvh) * 4 + cell % 4, valid


@triton.jit
def span_rows(ids_ptr, page_table_ptr, c0, width, kvh, n_kv_heads, CH: tl.constexpr, DENSE: tl.constexpr,
              IN_ORDER: tl.constexpr = False):
    """`chunk_rows`, or over a dense cache (DENSE: no ids, cell j of KV head kvh is row j * n_kv_heads + kvh) the
    rows of cells `c0 .. c0 + CH` below `width`."""
    if DENSE:
        cells = c0 + tl.arange(0, CH)
        rows, valid = cells.to(tl.int64) * n_kv_heads + kvh, cells < width
    else:
        rows, valid = chunk_rows(ids_ptr, page_table_ptr, c0, width, kvh, n_kv_heads, CH, IN_ORDER)
    return rows, valid


@triton.jit
def softmax_step(s, valid, m, l):
    """One online-softmax step over base-2 scores `s` [M, CH], cells `valid` [CH]: returns (e, alpha, m_new, l_new)."""
    return softmax_step_masked(s, valid[None, :], m, l)


@triton.jit
def softmax_step_masked(s, attend, m, l):
    """`softmax_step` with a mask [M, CH] of the cells each row attends to."""
    s = tl.where(attend, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    e = tl.exp2(s - m_use[:, None])
    alpha = tl.exp2(m - m_use)
    return e, alpha, m_new, l * alpha + tl.sum(e, axis=1)


def check_inputs(q, pool, ids, width, need_int8: bool = False):
    """Shapes the prompt kernels accept; returns (n_q, H, D, heads per KV head)."""
    n_q, n_heads, dim = q.shape
    if n_heads % pool.n_kv_heads or dim != pool.head_dim or dim % 64:
        raise ValueError(f"q {tuple(q.shape)} does not fit a pool of {pool.n_kv_heads} KV heads x {pool.head_dim}")
    if need_int8 and not pool.int8:
        raise ValueError("this prompt kernel reads int8 pools only")
    if ids.shape[0] != n_q or width.shape != (n_q,):
        raise ValueError("ids must be [n_q, cap] and width [n_q]")
    group = n_heads // pool.n_kv_heads
    if group > 64:
        raise ValueError(f"{group} query heads per KV head: at most 64")
    return n_q, n_heads, dim, group


def rows_block(group: int) -> int:
    """Query-head rows per program: the heads of one KV head, padded to the MMA's 16 (a power of two)."""
    return max(16, triton.next_power_of_2(group))


def launch_prompt_kernel(kernel, q, pool, page_table, ids, width, sm_scale: float | None, need_int8: bool = False,
                         **meta) -> torch.Tensor:
    """The host side every prompt-attention variant shares: check the inputs, allocate [n_q, H, D] fp32, launch
    `kernel` over (query, KV head) with the common arguments; `meta` carries the variant's own constexprs."""
    n_q, n_heads, dim, group = check_inputs(q, pool, ids, width, need_int8=need_int8)
    scale = 1 / math.sqrt(dim) if sm_scale is None else sm_scale
    out = torch.empty(n_q, n_heads, dim, dtype=torch.float32, device=q.device)
    if n_q == 0:
        return out
    scales = (pool.k_scale, pool.v_scale) if pool.int8 else (pool.k, pool.v)  # unused pointers for fp16
    kernel[(n_q, pool.n_kv_heads)](
        q.float().contiguous(), out, ids.to(torch.int32).contiguous(), width.to(torch.int32).contiguous(),
        page_table.to(torch.int32).contiguous(), pool.k, pool.v, *scales, ids.shape[1], pool.n_kv_heads,
        scale * LOG2E, G=group, BM=rows_block(group), CH=CHUNK, **meta)
    return out
