"""Grouped fp16 expert matmul over 64-row tiles: the STRATA_PREFILL_MMQ=0 path of the prompt experts.

Each program decodes its expert's weights slice by slice (`decode32`), scales them to fp16 and runs `tl.dot` in
fp16 with float32 accumulation against fp16 activations: the dequantize-then-GEMM path, without a dequantized copy
of the weights in memory. fp16 rather than bf16: 3 more bits on both operands (Q2_0's d * code is exact in fp16), and
Triton 3.6's interpreter gets bf16 dots wrong, so the CPU tests could not run bf16. Activations beyond 65504 would
overflow; the expert inputs are normed, so they stay far below it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from strata.kernels.moe.decode import code_tables, decode32
from strata.kernels.moe.dispatch import use_triton
from strata.kernels.moe.grouping import Grouping
from strata.kernels.moe.mmq import expert_rows
from strata.kernels.moe.stack import ExpertMatrix, Tiles, tile_config


@triton.jit
def _grouped_fp16_kernel(a, row_token, tile_expert, n_tiles, w, tab, out, n_out, expert_bytes, row_bytes,
                         K: tl.constexpr, GATHER: tl.constexpr, FMT: tl.constexpr, QK: tl.constexpr,
                         TS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    pid = tl.program_id(0)
    n_blocks = tl.cdiv(n_out, BN)
    tile = pid // n_blocks
    if tile >= tl.load(n_tiles):
        return
    expert = tl.load(tile_expert + tile).to(tl.int64)
    rows = tile * BM + tl.arange(0, BM)
    token = tl.load(row_token + rows)
    am = token >= 0
    if GATHER:
        a_row = tl.where(am, token, 0).to(tl.int64)
    else:
        a_row = rows.to(tl.int64)
    n = (pid % n_blocks) * BN + tl.arange(0, BN)
    nm = n < n_out
    w_row = n * row_bytes  # int32 offsets from the expert's base: 32-bit address arithmetic per element
    w_e = w + expert * expert_bytes
    j = tl.arange(0, 32)[None, :]
    acc = tl.zeros((BM, BN), tl.float32)
    for k in range(0, K, 32):
        x = tl.load(a + a_row[:, None] * K + k + j, mask=am[:, None], other=0.0).to(tl.float16)
        q, s_lo, s_hi, mn = decode32(FMT, w_e, w_row + (k // QK) * TS, (k % QK) // 32, tab, nm)
        weight = q.to(tl.float32) * tl.where(j < 16, s_lo[:, None], s_hi[:, None]) + mn[:, None]
        acc = tl.dot(x, tl.trans(weight.to(tl.float16)), acc)
    tl.store(out + rows.to(tl.int64)[:, None] * n_out + n[None, :], acc, mask=am[:, None] & nm[None, :])


def grouped_mm_fp16(a: torch.Tensor, grouping: Grouping, weight: ExpertMatrix, gather: bool,
                    out: torch.Tensor | None = None, tiles: Tiles | None = None) -> torch.Tensor:
    """Each grouped row's activations (rounded to fp16) times its expert's weights (rounded to fp16): float32
    [max_rows, weight.rows]. a [R, K] per token when `gather`, else per grouped row; padding rows are left as they
    are in `out` (default: uninitialized)."""
    return (grouped_mm_fp16_triton if use_triton(a) else grouped_mm_fp16_ref)(a, grouping, weight, gather, out, tiles)


def grouped_mm_fp16_triton(a, grouping, weight, gather, out=None, tiles=None):
    a = a.contiguous()
    k = a.shape[1]
    weight.check_dot_length(k)
    spec = weight.spec
    if out is None:
        out = torch.empty(grouping.max_rows, weight.rows, dtype=torch.float32, device=a.device)
    t = tile_config("dense", spec, weight.rows, a.is_cuda, tiles)
    grid = (grouping.max_tiles * triton.cdiv(weight.rows, t.bn),)
    if grid[0]:
        _grouped_fp16_kernel[grid](
            a, grouping.row_token, grouping.tile_expert, grouping.n_tiles, weight.raw, code_tables(a.device), out,
            weight.rows, weight.expert_stride, weight.row_bytes, K=k, GATHER=gather, FMT=spec.fmt_id,
            QK=spec.block_size, TS=spec.type_size, BM=grouping.tile_rows, BN=t.bn, num_warps=t.warps, num_stages=t.stages)
    return out


def grouped_mm_fp16_ref(a, grouping, weight, gather, out=None, tiles=None):
    """float64 products of the fp16-rounded activations and weights, rounded once to float32."""
    if out is None:
        out = torch.zeros(grouping.max_rows, weight.rows, dtype=torch.float32, device=a.device)
    x = a.to(torch.float16).double()
    for e, rows in expert_rows(grouping):
        rows_a = x[grouping.row_token[rows].long()] if gather else x[rows]
        out[rows] = (rows_a @ weight.expert(e).to(torch.float16).double().T).float()
    return out
