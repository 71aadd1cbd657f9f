"""Prompt attention, the plain fp32 kernel (`STRATA_PROMPT_ATTN_OLD=1`): K and V dequantized to fp32, fp32 dots.

The yardstick of the fast kernels (their parity bounds are taken against it). One program per (query, KV head);
the query's heads are the rows; chunks of 32 selected cells; online softmax in base 2. int8 or fp16 pools.
Reference: `prompt_ref.prompt_attn_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from strata.kernels.attention.paged import PagedKV
from strata.kernels.attention.prompt_parts import chunk_rows, launch_prompt_kernel, softmax_step


@triton.jit
def _prompt_fp32_kernel(q_ptr, out_ptr, ids_ptr, width_ptr, page_table_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr,
                        cap, n_kv_heads, scale_log2,
                        G: tl.constexpr, BM: tl.constexpr, D: tl.constexpr, CH: tl.constexpr, INT8: tl.constexpr):
    qi = tl.program_id(0)
    kvh = tl.program_id(1)
    r = tl.arange(0, BM)
    d = tl.arange(0, D)
    head = (qi.to(tl.int64) * n_kv_heads + kvh) * G + r
    q = tl.load(q_ptr + head[:, None] * D + d[None, :], mask=r[:, None] < G, other=0.0)
    width = tl.load(width_ptr + qi)
    ids_row = ids_ptr + qi.to(tl.int64) * cap
    m = tl.full((BM,), float("-inf"), tl.float32)
    l = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, D), tl.float32)
    for c0 in range(0, width, CH):
        rows, valid = chunk_rows(ids_row, page_table_ptr, c0, width, kvh, n_kv_heads, CH)
        k = tl.load(k_ptr + rows[None, :] * D + d[:, None], mask=valid[None, :], other=0).to(tl.float32)  # [D, CH]
        v = tl.load(v_ptr + rows[:, None] * D + d[None, :], mask=valid[:, None], other=0).to(tl.float32)  # [CH, D]
        if INT8:
            k *= tl.load(ks_ptr + rows[None, :] * (D // 64) + d[:, None] // 64, mask=valid[None, :], other=0.0)
            v *= tl.load(vs_ptr + rows[:, None] * (D // 64) + d[None, :] // 64, mask=valid[:, None], other=0.0)
        s = tl.dot(q, k, input_precision="ieee") * scale_log2
        e, alpha, m, l = softmax_step(s, valid, m, l)
        acc = acc * alpha[:, None] + tl.dot(e, v, input_precision="ieee")
    out = tl.where(l[:, None] > 0, acc / l[:, None], 0.0)
    tl.store(out_ptr + head[:, None] * D + d[None, :], out, mask=r[:, None] < G)


def prompt_attn_fp32(q: torch.Tensor, pool: PagedKV, page_table: torch.Tensor, ids: torch.Tensor,
                     width: torch.Tensor, sm_scale: float | None = None) -> torch.Tensor:
    """The fp32 prompt kernel: [n_q, H, D] fp32."""
    return launch_prompt_kernel(_prompt_fp32_kernel, q, pool, page_table, ids, width, sm_scale,
                                D=q.shape[-1], INT8=pool.int8, num_warps=8, num_stages=2)
