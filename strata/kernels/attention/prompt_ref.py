"""Prompt attention over selected cells, the reference: each query attends to its own cells through the page table.

Inputs shared by every prompt kernel:
- `q` [n_q, H, D] fp32 (normed, RoPE'd); head h reads KV head `h // (H / n_kv_heads)`;
- `ids` [n_q, cap] int32: each query's selected logical cells, ascending, unique; the first `width[i]` are valid.
  The selection is the whole mask (no further causal mask);
- `pool` + `page_table`: the paged KV (paged.py).
Output [n_q, H, D]: `softmax(q . K / sqrt(D)) V` over the selected cells, not gated; 0 for an empty selection.
"""

from __future__ import annotations

import math

import torch

from strata.kernels.attention.kv_int8 import gather_kv
from strata.kernels.attention.paged import PagedKV

GATHER_ELEMENTS = 1 << 24  # cells x dims gathered at once


def prompt_attn_ref(q: torch.Tensor, pool: PagedKV, page_table: torch.Tensor, ids: torch.Tensor,
                    width: torch.Tensor, sm_scale: float | None = None,
                    dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The attention in `dtype` (float64 for parity: scores, softmax and sums all in float64)."""
    n_q, n_heads, dim = q.shape
    group = n_heads // pool.n_kv_heads
    scale = 1 / math.sqrt(dim) if sm_scale is None else sm_scale
    out = torch.zeros(n_q, n_heads, dim, dtype=dtype, device=q.device)
    cap = ids.shape[1]
    step = max(1, GATHER_ELEMENTS // max(1, cap * dim))
    slots = torch.arange(cap, device=q.device)
    for q0 in range(0, n_q, step):
        rows = slice(q0, q0 + step)
        valid = slots[None] < width[rows, None].to(q.device)
        cells = torch.where(valid, ids[rows].long(), 0)
        for kvh in range(pool.n_kv_heads):
            k, v = gather_kv(pool, page_table, cells, kvh, dtype)
            heads = slice(kvh * group, (kvh + 1) * group)
            s = torch.einsum("qgd,qcd->qgc", q[rows, heads].to(dtype), k) * scale
            p = torch.softmax(s.masked_fill(~valid[:, None], float("-inf")), -1).nan_to_num(0.0)
            out[rows, heads] = torch.einsum("qgc,qcd->qgd", p, v)
    return out
