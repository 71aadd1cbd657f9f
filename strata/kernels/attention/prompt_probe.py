"""Probes for the sweep (`bench prompt-attn --sweep`): where a blocked prompt kernel's time goes, not attention.

- `probe_gather`: the same programs, chunks and gathers as v2 / imma (ids, page table, K and V codes and scales, the
  config's pipeline), each load feeding an int8 dot with all-ones as there (the pipeliner only prefetches loads that
  reach a dot), and no other math: about the time of the loads alone.
- `probe_imma_scores`: imma without P.V (no V loads, no second product): gathers + q . k + softmax.
Their outputs are meaningless (the sweep prints their times as information, never as results); tests only check that
they run and that the gather probe's sums are the V codes' sums.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import triton
import triton.language as tl

from strata.kernels.attention.paged import PagedKV
from strata.kernels.attention.prompt_blocks import (PromptConfig, block_chunk, block_rows, block_store,
                                                     cell_attend, cell_rows, launch_blocked, split_range)


@triton.jit
def _probe_gather_kernel(q_ptr, out_ptr, parts_ptr, ml_ptr, cells_ptr, members_ptr, count_ptr, page_table_ptr, k_ptr,
                         v_ptr, ks_ptr, vs_ptr, block0, n_q, row_len, n_kv_heads, scale_log2,
                         G: tl.constexpr, HP: tl.constexpr, BQ: tl.constexpr, BM: tl.constexpr, CH: tl.constexpr,
                         TRANSLATED: tl.constexpr, SPLITS: tl.constexpr, PREFETCH: tl.constexpr, NG: tl.constexpr):
    D: tl.constexpr = NG * 64
    blk, kvh, slot, head, ok = block_rows(block0, n_q, n_kv_heads, G, HP, BQ, BM)
    gi = tl.arange(0, NG)
    g = gi[:, None, None]
    d = tl.arange(0, 64)[None, None, :]
    dk = tl.arange(0, 64)[None, :, None]
    count = tl.load(count_ptr + blk)
    cells_row = cells_ptr + blk.to(tl.int64) * row_len
    members_row = members_ptr + blk.to(tl.int64) * row_len
    # all-ones operands: each load feeds a dot as in v2 / imma (so the pipeliner treats it alike), for little math
    ones_q = tl.full((NG, BM, 64), 1, tl.int8)
    ones_p = tl.full((NG, BM, CH), 1, tl.int8)
    acc = tl.zeros((NG, BM, 64), tl.int32)
    total = tl.zeros((BM,), tl.float32)
    c_lo, c_hi = split_range(count, CH, SPLITS)
    for c0 in range(c_lo, c_hi, CH):
        rows, valid, attend = block_chunk(cells_row, members_row, page_table_ptr, c0, count, kvh, n_kv_heads, slot,
                                          CH, BQ, TRANSLATED)
        k = tl.load(k_ptr + rows[None, None, :] * D + g * 64 + dk, mask=valid[None, None, :], other=0)
        ks = tl.load(ks_ptr + rows[None, :] * NG + gi[:, None], mask=valid[None, :], other=0.0).to(tl.float32)
        v = tl.load(v_ptr + rows[None, :, None] * D + g * 64 + d, mask=valid[None, :, None], other=0)
        vs = tl.load(vs_ptr + rows[None, :] * NG + gi[:, None], mask=valid[None, :], other=0.0).to(tl.float32)
        t = tl.dot(ones_q, k).to(tl.float32) * ks[:, None, :]  # [NG, BM, CH]: each cell's K codes summed, scaled
        total += tl.sum(tl.sum(t, axis=2), axis=0) + tl.sum(tl.sum(vs, axis=1), axis=0)
        acc = tl.dot(ones_p, v, acc, out_dtype=tl.int32)  # [NG, BM, 64]: V codes summed over the cells, per dim
    # out: the V codes' sums (checkable); the rest goes to m, so nothing is left out by the compiler
    block_store(out_ptr, parts_ptr, ml_ptr, acc.to(tl.float32), total, tl.zeros((BM,), tl.float32) + 1.0, head, ok,
                NG, SPLITS)


def probe_gather(q: torch.Tensor, pool: PagedKV, page_table: torch.Tensor, ids: torch.Tensor, width: torch.Tensor,
                 config: PromptConfig) -> torch.Tensor:
    """[n_q, H, D]: per query and KV head, the sum of its cells' V codes per dim (one split only)."""
    return launch_blocked(_probe_gather_kernel, q, pool, page_table, ids, width, None, probe_config(config),
                          NG=q.shape[-1] // 64)


def probe_imma_scores(q: torch.Tensor, pool: PagedKV, page_table: torch.Tensor, ids: torch.Tensor,
                      width: torch.Tensor, config: PromptConfig) -> torch.Tensor:
    """imma's kernel (`g1`: its per-group form) with P.V left out (zeros out)."""
    from strata.kernels.attention.prompt_imma import _prompt_imma_kernel
    from strata.kernels.attention.prompt_imma_cells import _prompt_imma_cells_kernel

    kernel = _prompt_imma_cells_kernel if config.scores else _prompt_imma_kernel
    extra = {"vbound_ptr": pool.v_scale} if config.scores else {}  # unused without P.V
    return launch_blocked(kernel, q, pool, page_table, ids, width, None, probe_config(config), NG=q.shape[-1] // 64,
                          PV=0, **extra)


def probe_config(config: PromptConfig) -> PromptConfig:
    """The probes' form of a config (their kernels take neither prefix blocks nor the launch order): a prefix
    config's one-query launch, which is all of it at a long context's sparse selections; without `y`'s splits."""
    if config.prefix:
        config = replace(config, queries=1, heads=0)
    return replace(config, prefix=0, order=0, spread=0)
