"""Quest selection (`--qsa quest`), training-free, for models without an indexer.

Keys are grouped in Quest blocks of `block` cells (a multiple of 4); each block keeps the elementwise min and max of
its keys per KV head. A query head's bound on its logit against any key of the block is
`sum_d max(q_d * min_d, q_d * max_d) = relu(q) . max + min(q, 0) . min` (two GEMMs). The selection is one set of
cells per query token, shared by its heads: a block's score is the best over heads of its bound minus that head's
best bound in view (how far below the head's strongest block it can be at most). The first Quest block and the
`window` newest cells are always kept (score +inf); kernels/select's top-k then takes the best `budget` cells, ties
to the lowest index, ascending: its Triton kernel on the GPU, its stable-sort reference on the CPU.
"""

from __future__ import annotations

import torch

from strata.kernels.select.topk import select_cells, select_cells_ref, select_cells_triton

SCORE_ELEMENTS = 1 << 24  # (query, head, block) bounds computed at once


def block_bounds(keys: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(min, max) [n_blocks, Hkv, D] of keys [n, Hkv, D] in blocks of `block` cells (the last may be short)."""
    n_blocks = -(-keys.shape[0] // block)
    pad = n_blocks * block - keys.shape[0]
    lo = torch.nn.functional.pad(keys, (0, 0, 0, 0, 0, pad), value=float("inf")).unflatten(0, (n_blocks, block))
    hi = torch.nn.functional.pad(keys, (0, 0, 0, 0, 0, pad), value=float("-inf")).unflatten(0, (n_blocks, block))
    return lo.amin(1), hi.amax(1)


def upper_bounds(q: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor) -> torch.Tensor:
    """Bounds [T, H, n_blocks] (float32) on q [T, H, D] . k over each block's keys (GQA: head h reads KV head
    h // (H / Hkv))."""
    n_tokens, n_heads, dim = q.shape
    n_kv_heads = kmin.shape[1]
    qg = q.float().view(n_tokens, n_kv_heads, n_heads // n_kv_heads, dim)
    bound = (torch.einsum("tkgd,bkd->tkgb", qg.clamp(min=0), kmax.float())
             + torch.einsum("tkgd,bkd->tkgb", qg.clamp(max=0), kmin.float()))
    return bound.reshape(n_tokens, n_heads, -1)


def upper_bounds_f64(q: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor) -> torch.Tensor:
    """`upper_bounds` as Quest writes it, elementwise in float64: the check of the GEMM form."""
    group = q.shape[1] // kmin.shape[1]
    lo, hi = (x.double().repeat_interleave(group, 1)[None] for x in (kmin, kmax))  # [1, B, H, D]
    qd = q.double()[:, None]  # [T, 1, H, D]
    return torch.maximum(qd * lo, qd * hi).sum(-1).transpose(1, 2)


def quest_scores(q: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor, n_kv: torch.Tensor, block: int,
                 window: int, n_cols: int | None = None) -> torch.Tensor:
    """Scores [T, n_cols] per 4-cell column for `select_cells`: +inf for kept cells, -inf past n_kv. `n_cols`
    (default ceil(max n_kv / 4), read from the device) fixed by the caller keeps the shapes static (a captured step)."""
    n_kv = n_kv.long().to(q.device)
    n_blocks = kmin.shape[0]
    bound = upper_bounds(q, kmin, kmax)
    in_view = (torch.arange(n_blocks, device=q.device)[None] * block < n_kv[:, None])[:, None]  # [T, 1, B]
    bound = bound.masked_fill(~in_view, float("-inf"))
    score = (bound - bound.amax(2, keepdim=True)).amax(1)  # [T, B]: best over heads, below each head's best
    n_cols = -(-int(n_kv.max()) // 4) if n_cols is None else n_cols
    col = torch.arange(n_cols, device=q.device)[None]
    score = score.repeat_interleave(block // 4, 1)[:, :n_cols]
    kept = (col < block // 4) | (4 * col + 3 >= n_kv[:, None] - window)
    score = torch.where(kept, float("inf"), score)
    return torch.where(4 * col < n_kv[:, None], score, float("-inf"))


def quest_select(q: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor, n_kv: torch.Tensor, block: int,
                 window: int, budget: int, n_cols: int | None = None,
                 kernels: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [T, budget] int32 ascending, padded with -1; width [T] = min(n_kv, budget)) of queries q [T, H, D] that
    see `n_kv` [T] cells, from the Quest block bounds kmin/kmax [n_blocks, Hkv, D]. `n_cols`: as quest_scores;
    `kernels`: the Triton top-k (default on the GPU), or its reference."""
    n_tokens, n_heads = q.shape[:2]
    step = max(1, SCORE_ELEMENTS // max(1, n_heads * kmin.shape[0]))
    top = select_cells if kernels is None else (select_cells_triton if kernels else select_cells_ref)
    parts = [top(quest_scores(q[t0 : t0 + step], kmin, kmax, n_kv[t0 : t0 + step], block, window, n_cols),
                 n_kv[t0 : t0 + step], top_k=budget - 3) for t0 in range(0, n_tokens, step)]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
