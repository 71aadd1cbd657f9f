"""Prompt attention v2, the default for int8 pools: v1's math (prompt_v1.py), organized for overlap.

- q's hi and lo parts stay in registers as [group, heads, 64] tiles; both products run as one batched dot over the
  64-dim groups (the groups are the scale groups of the int8 format).
- Scores: per-group partials `t_g * k_scale_g`, summed over the groups in one fixed order (deterministic: the same
  bytes run to run), times `scale_log2 * 2^(qe - 14)`.
- The chunk loop is software pipelined by Triton (`num_stages`): cell ids, then pool rows, then K/V loads run
  ahead of the chunk being computed through async copies (sm_80+).
- v2t (`STRATA_PA_V2T=1`, and automatically below sm_80): the same code with `num_stages=1`, no async copies; the
  loads land in registers and are used in place. Same math, same bytes as v2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from strata.kernels.attention.paged import PagedKV
from strata.kernels.attention.prompt_parts import chunk_rows, launch_prompt_kernel, softmax_step
from strata.kernels.attention.prompt_v1 import pv_hilo, q_exponent, split_hilo

STAGES = 3  # ids two chunks ahead, rows one ahead


@triton.jit
def _prompt_v2_kernel(q_ptr, out_ptr, ids_ptr, width_ptr, page_table_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr,
                      cap, n_kv_heads, scale_log2,
                      G: tl.constexpr, BM: tl.constexpr, NG: tl.constexpr, CH: tl.constexpr):
    D: tl.constexpr = NG * 64
    qi = tl.program_id(0)
    kvh = tl.program_id(1)
    g = tl.arange(0, NG)[:, None, None]
    r = tl.arange(0, BM)[None, :, None]
    d = tl.arange(0, 64)[None, None, :]
    head = (qi.to(tl.int64) * n_kv_heads + kvh) * G + r
    q = tl.load(q_ptr + head * D + g * 64 + d, mask=r < G, other=0.0)  # [NG, BM, 64]
    up, down = q_exponent(tl.max(tl.max(tl.max(tl.abs(q), axis=2), axis=1), axis=0))
    hi, lo = split_hilo(q * up)
    qdown = scale_log2 * down
    width = tl.load(width_ptr + qi)
    ids_row = ids_ptr + qi.to(tl.int64) * cap
    m = tl.full((BM,), float("-inf"), tl.float32)
    l = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((NG, BM, 64), tl.float32)
    dk = tl.arange(0, 64)[None, :, None]
    for c0 in range(0, width, CH):
        rows, valid = chunk_rows(ids_row, page_table_ptr, c0, width, kvh, n_kv_heads, CH)
        k = tl.load(k_ptr + rows[None, None, :] * D + g * 64 + dk, mask=valid[None, None, :], other=0)
        ks = tl.load(ks_ptr + rows[None, :] * NG + tl.arange(0, NG)[:, None], mask=valid[None, :], other=0.0)
        k = k.to(tl.float16)
        t = tl.dot(lo, k, tl.dot(hi, k))  # [NG, BM, CH]
        s = tl.sum(t * ks.to(tl.float32)[:, None, :], axis=0) * qdown
        e, alpha, m, l = softmax_step(s, valid, m, l)
        acc = acc * alpha[None, :, None] + pv_hilo(e, v_ptr, vs_ptr, rows, valid, NG, CH, True)
    out = tl.where(l[None, :, None] > 0, acc / l[None, :, None], 0.0)
    tl.store(out_ptr + head * D + g * 64 + d, out, mask=r < G)


def _launch(q, pool, page_table, ids, width, sm_scale, num_stages):
    return launch_prompt_kernel(_prompt_v2_kernel, q, pool, page_table, ids, width, sm_scale, need_int8=True,
                                NG=q.shape[-1] // 64, num_warps=4, num_stages=num_stages)


def prompt_attn_v2(q: torch.Tensor, pool: PagedKV, page_table: torch.Tensor, ids: torch.Tensor,
                   width: torch.Tensor, sm_scale: float | None = None) -> torch.Tensor:
    """Prompt attention v2 (int8 pool, pipelined): [n_q, H, D] fp32."""
    return _launch(q, pool, page_table, ids, width, sm_scale, STAGES)


def prompt_attn_v2t(q: torch.Tensor, pool: PagedKV, page_table: torch.Tensor, ids: torch.Tensor,
                    width: torch.Tensor, sm_scale: float | None = None) -> torch.Tensor:
    """Prompt attention v2t (int8 pool, register staged, no async copies): [n_q, H, D] fp32."""
    return _launch(q, pool, page_table, ids, width, sm_scale, 1)
