"""Prompt attention v2, the default for int8 pools: v1's math (prompt_v1.py), organized for reuse and overlap.

- Blocked (prompt_blocks.py): a program's dot rows are a block of queries x query heads of one KV head, and each
  chunk of the cells they share is loaded once for all of them; the tunables are a `PromptConfig`.
- q's hi and lo parts stay in registers as [group, rows, 64] tiles, with an exponent per row (per query head:
  `max|q| < 2^qe` over the head's dims; v1 takes one over the query's heads); both products run as one batched dot
  over the 64-dim groups (the groups are the scale groups of the int8 format).
- Scores: per-group partials `t_g * k_scale_g`, summed over the groups in one fixed order (deterministic: the same
  bytes run to run), times `scale_log2 * 2^(qe - 14)`.
- The chunk loop is software pipelined by Triton (`stages`): cell ids, then pool rows, then K/V loads run ahead of
  the chunk being computed through async copies (sm_80+).
- v2t (`STRATA_PA_V2T=1`, and automatically below sm_80): the same code with one stage, no async copies; the loads
  land in registers and are used in place. Same math, same bytes as v2.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import triton
import triton.language as tl

from strata.errors import StrataError
from strata.kernels.attention.paged import PagedKV
from strata.kernels.attention.prompt_blocks import (PromptConfig, block_chunk, block_rows, block_store,
                                                     cell_attend, cell_rows, launch_blocked, split_range)
from strata.kernels.attention.prompt_parts import softmax_step_masked
from strata.kernels.attention.prompt_v1 import (codes_to_half, join_halves, pv_hilo, pv_hilo_halves, q_exponent,
                                                  split_hilo)

# the H200 sweep's fastest (session 4): one query and its KV group per program; blocks of queries ran up to 2x slower
# H200 sweep (session 5): ids translated before the launch and 128 registers a thread, 1.20x, the same bytes
# Session 6's sweep: `t2r168x1` 1.810 ms at 32K x 1024 (2.112 before), 1.16x over the five shapes, the same bytes
DEFAULT = PromptConfig(queries=1, heads=0, chunk=32, warps=4, stages=3, translate=2, maxreg=168, exact=1)


@triton.jit
def _prompt_v2_kernel(q_ptr, out_ptr, parts_ptr, ml_ptr, cells_ptr, members_ptr, count_ptr, page_table_ptr, k_ptr,
                      v_ptr, ks_ptr, vs_ptr, block0, n_q, row_len, n_kv_heads, scale_log2,
                      G: tl.constexpr, HP: tl.constexpr, BQ: tl.constexpr, BM: tl.constexpr, CH: tl.constexpr,
                      TRANSLATED: tl.constexpr, SPLITS: tl.constexpr, PREFETCH: tl.constexpr, NG: tl.constexpr,
                      EXACT: tl.constexpr = 0, HALVES: tl.constexpr = False,
                      REVERSE: tl.constexpr = False):
    D: tl.constexpr = NG * 64
    blk, kvh, slot, head, ok = block_rows(block0, n_q, n_kv_heads, G, HP, BQ, BM, REVERSE)
    g = tl.arange(0, NG)[:, None, None]
    d = tl.arange(0, 64)[None, None, :]
    hd = head[None, :, None]
    q = tl.load(q_ptr + hd * D + g * 64 + d, mask=ok[None, :, None], other=0.0)  # [NG, BM, 64]
    up, down = q_exponent(tl.max(tl.max(tl.abs(q), axis=2), axis=0))  # per row
    hi, lo = split_hilo(q * up[None, :, None])
    qdown = scale_log2 * down
    count = tl.load(count_ptr + blk)
    cells_row = cells_ptr + blk.to(tl.int64) * row_len
    members_row = members_ptr + blk.to(tl.int64) * row_len
    m = tl.full((BM,), float("-inf"), tl.float32)
    l = tl.zeros((BM,), tl.float32)
    if HALVES:  # dims 0-31 and 32-63 of each group (pv_hilo_halves)
        acc_a = tl.zeros((NG, BM, 32), tl.float32)
        acc_b = tl.zeros((NG, BM, 32), tl.float32)
    else:
        acc = tl.zeros((NG, BM, 64), tl.float32)
    dk = tl.arange(0, 64)[None, :, None]
    c_lo, c_hi = split_range(count, CH, SPLITS)
    if PREFETCH:
        rows_next, valid_next = cell_rows(cells_row, page_table_ptr, c_lo, count, kvh, n_kv_heads, CH, TRANSLATED)
    for c0 in range(c_lo, c_hi, CH):
        if PREFETCH:  # this chunk's rows came with the previous step; the next chunk's load now
            rows, valid = rows_next, valid_next
            rows_next, valid_next = cell_rows(cells_row, page_table_ptr, c0 + CH, count, kvh, n_kv_heads, CH,
                                              TRANSLATED)
            attend = cell_attend(members_row, c0, valid, slot, CH, BQ)
        else:
            rows, valid, attend = block_chunk(cells_row, members_row, page_table_ptr, c0, count, kvh, n_kv_heads,
                                              slot, CH, BQ, TRANSLATED)
        k = tl.load(k_ptr + rows[None, None, :] * D + g * 64 + dk, mask=valid[None, None, :], other=0)
        ks = tl.load(ks_ptr + rows[None, :] * NG + tl.arange(0, NG)[:, None], mask=valid[None, :], other=0.0)
        k = codes_to_half(k, EXACT)
        t = tl.dot(lo, k, tl.dot(hi, k))  # [NG, BM, CH]
        s = tl.sum(t * ks.to(tl.float32)[:, None, :], axis=0) * qdown[:, None]
        e, alpha, m, l = softmax_step_masked(s, attend, m, l)
        if HALVES:
            acc_a, acc_b = pv_hilo_halves(e, v_ptr, vs_ptr, rows, valid, acc_a, acc_b, alpha, NG, EXACT)
        else:
            acc = acc * alpha[None, :, None] + pv_hilo(e, v_ptr, vs_ptr, rows, valid, NG, CH, True, EXACT)
    if HALVES:
        acc = join_halves(acc_a, acc_b, NG, BM)
    block_store(out_ptr, parts_ptr, ml_ptr, acc, m, l, head, ok, NG, SPLITS)


def prompt_attn_v2(q: torch.Tensor, pool: PagedKV, page_table: torch.Tensor, ids: torch.Tensor,
                   width: torch.Tensor, sm_scale: float | None = None,
                   config: PromptConfig | None = None) -> torch.Tensor:
    """Prompt attention v2 (int8 pool, pipelined): [n_q, H, D] fp32."""
    config = PromptConfig.chosen(config, DEFAULT)
    if config.pv not in (0, 16) or config.scores or config.qparts:
        raise StrataError(f"prompt-attention config {config.label}: v2's P.V is fp16 (p16) only, its scores batched")
    if config.prefix:
        raise StrataError(f"prompt-attention config {config.label}: prefix blocks (i1, i2) are imma g1's")
    extra = {"HALVES": True} if config.halves else {}  # unset: the launch as before
    return launch_blocked(_prompt_v2_kernel, q, pool, page_table, ids, width, sm_scale, config, NG=q.shape[-1] // 64,
                          EXACT=config.exact, **extra)


def prompt_attn_v2t(q: torch.Tensor, pool: PagedKV, page_table: torch.Tensor, ids: torch.Tensor,
                    width: torch.Tensor, sm_scale: float | None = None,
                    config: PromptConfig | None = None) -> torch.Tensor:
    """Prompt attention v2t (int8 pool, register staged, no async copies): [n_q, H, D] fp32."""
    config = replace(PromptConfig.chosen(config, DEFAULT), stages=1)
    return prompt_attn_v2(q, pool, page_table, ids, width, sm_scale, config)
