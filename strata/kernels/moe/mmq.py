"""Grouped int8 expert matmul over 64-row tiles: the llama.cpp-MMQ counterpart of the prompt experts.

Activations come as int8 codes with a float scale per 32 values (`quantize32`); each 32-weight slice of a GGML block
is decoded to int8 codes by `decode32`; `tl.dot` of the two is an exact int32, scaled in the epilogue:
`acc += dx * (s * dot)`, or `dx * (s_lo * dot_lo + s_hi * dot_hi)` for the formats with a scale per 16 weights, plus
`dx * mn * sum(codes)` for those with an offset. With SHARED64 (Q2_0, whose two 32-value halves share the block's d)
a 64-step is `acc += d * (dx0 * dot0 + dx1 * dot1)`: one scale product fewer per output (the fused path uses it).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from strata.kernels.moe.decode import code_tables, decode32, q2_0_codes_words, q2_0_words
from strata.kernels.moe.dispatch import use_triton
from strata.kernels.moe.grouping import Grouping
from strata.kernels.moe.quantize32 import dequantize_rows_int8
from strata.kernels.moe.stack import ExpertMatrix, Tiles, tile_config


@triton.jit
def load_step(a, a_scale, a_sum, a_row, am, k0, K: tl.constexpr, HAS_MIN: tl.constexpr):
    """The activation codes [BM, 32] of both halves of the 64-step at k0, their scales and (HAS_MIN) code sums."""
    j = tl.arange(0, 32)[None, :]
    codes = a + a_row[:, None] * K + k0 + j
    group = a_row * (K // 32) + k0 // 32
    xc0 = tl.load(codes, mask=am[:, None], other=0)
    xc1 = tl.load(codes + 32, mask=am[:, None], other=0)
    dx0 = tl.load(a_scale + group, mask=am, other=0.0)
    dx1 = tl.load(a_scale + group + 1, mask=am, other=0.0)
    if HAS_MIN:
        xs0 = tl.load(a_sum + group, mask=am, other=0).to(tl.float32)
        xs1 = tl.load(a_sum + group + 1, mask=am, other=0).to(tl.float32)
    else:
        xs0 = dx0
        xs1 = dx1
    return xc0, xc1, dx0, dx1, xs0, xs1


@triton.jit
def _slice(xc, dx, xs, w, blk, sub, tab, nm, FMT: tl.constexpr, SPLIT16: tl.constexpr, HAS_MIN: tl.constexpr):
    q, s_lo, s_hi, mn = decode32(FMT, w, blk, sub, tab, nm)
    qt = tl.trans(q)
    dot = tl.dot(xc, qt)
    if SPLIT16:
        low = tl.dot(tl.where(tl.arange(0, 32)[None, :] < 16, xc, tl.zeros_like(xc)), qt)
        part = s_lo[None, :] * low.to(tl.float32) + s_hi[None, :] * (dot - low).to(tl.float32)
    else:
        part = s_lo[None, :] * dot.to(tl.float32)
    if HAS_MIN:
        part += mn[None, :] * xs[:, None]
    return dx[:, None] * part


@triton.jit
def weights_step(acc, xc0, xc1, dx0, dx1, xs0, xs1, w, w_row, nm, k0, tab, FMT: tl.constexpr, QK: tl.constexpr,
                 TS: tl.constexpr, SPLIT16: tl.constexpr, HAS_MIN: tl.constexpr, SHARED64: tl.constexpr):
    """acc [BM, BN] plus the 64-step at k0 of the weight rows w_row (byte offsets [BN]) against the activations."""
    if SHARED64:
        blk = w_row + (k0 // 64) * TS
        q0, d, _, _ = decode32(FMT, w, blk, 0, tab, nm)
        q1, _, _, _ = decode32(FMT, w, blk, 1, tab, nm)
        dot0 = tl.dot(xc0, tl.trans(q0)).to(tl.float32)
        dot1 = tl.dot(xc1, tl.trans(q1)).to(tl.float32)
        acc += d[None, :] * (dx0[:, None] * dot0 + dx1[:, None] * dot1)
    else:
        k1 = k0 + 32
        acc += _slice(xc0, dx0, xs0, w, w_row + (k0 // QK) * TS, (k0 % QK) // 32, tab, nm, FMT, SPLIT16, HAS_MIN)
        acc += _slice(xc1, dx1, xs1, w, w_row + (k1 // QK) * TS, (k1 % QK) // 32, tab, nm, FMT, SPLIT16, HAS_MIN)
    return acc


@triton.jit
def q2_0_step(acc, xc0, xc1, dx0, dx1, d, words0, words1, BN: tl.constexpr, SHARED64: tl.constexpr):
    """weights_step for Q2_0 from its code words: the same products in the same order, without byte gathers."""
    dot0 = tl.dot(xc0, tl.trans(q2_0_codes_words(words0, BN))).to(tl.float32)
    dot1 = tl.dot(xc1, tl.trans(q2_0_codes_words(words1, BN))).to(tl.float32)
    if SHARED64:
        acc += d[None, :] * (dx0[:, None] * dot0 + dx1[:, None] * dot1)
    else:
        acc += dx0[:, None] * (d[None, :] * dot0)
        acc += dx1[:, None] * (d[None, :] * dot1)
    return acc


@triton.jit
def q2_0_loop(acc, a, a_scale, a_row, am, w, w_row, nm, K: tl.constexpr, TS: tl.constexpr, BN: tl.constexpr,
              SHARED64: tl.constexpr):
    """acc plus the whole dot of Q2_0 weight rows w_row with the activations. The weight words are loaded one step
    ahead (int32 registers double-buffer them); the activation codes are loaded where the dots read them, which
    lets Triton's pipeliner (num_stages) copy them ahead asynchronously (int8 carried in registers would be
    unpacked to one byte per register)."""
    at = w + w_row
    d, words0, words1 = q2_0_words(at, nm)
    for k0 in range(0, K, 64):
        # The next block (the last step reloads its own rather than branch), at a scalar offset from the first:
        # no pointer carried through the loop, whose 64-bit update per element cost more than the loads.
        nd, nwords0, nwords1 = q2_0_words(at + (tl.minimum(k0 + 64, K - 64) // 64) * TS, nm)
        xc0, xc1, dx0, dx1, _, _ = load_step(a, a_scale, a_scale, a_row, am, k0, K, False)
        acc = q2_0_step(acc, xc0, xc1, dx0, dx1, d, words0, words1, BN, SHARED64)
        d, words0, words1 = nd, nwords0, nwords1
    return acc


@triton.jit
def _grouped_int8_kernel(a, a_scale, a_sum, row_token, tile_expert, n_tiles, w, tab, out,
                         n_out, expert_bytes, row_bytes,
                         K: tl.constexpr, GATHER: tl.constexpr, FMT: tl.constexpr, QK: tl.constexpr,
                         TS: tl.constexpr, SPLIT16: tl.constexpr, HAS_MIN: tl.constexpr, SHARED64: tl.constexpr,
                         BM: tl.constexpr, BN: tl.constexpr):
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
    acc = tl.zeros((BM, BN), tl.float32)
    if FMT == 0:
        acc = q2_0_loop(acc, a, a_scale, a_row, am, w_e, w_row, nm, K, TS, BN, SHARED64)
    else:
        for k0 in range(0, K, 64):
            xc0, xc1, dx0, dx1, xs0, xs1 = load_step(a, a_scale, a_sum, a_row, am, k0, K, HAS_MIN)
            acc = weights_step(acc, xc0, xc1, dx0, dx1, xs0, xs1, w_e, w_row, nm, k0, tab,
                               FMT, QK, TS, SPLIT16, HAS_MIN, SHARED64)
    tl.store(out + rows.to(tl.int64)[:, None] * n_out + n[None, :], acc, mask=am[:, None] & nm[None, :])


def grouped_mm_int8(codes, scales, sums, grouping: Grouping, weight: ExpertMatrix, gather: bool,
                    shared64: bool = False, out: torch.Tensor | None = None, tiles: Tiles | None = None) -> torch.Tensor:
    """Each grouped row's int8 activations times its expert's weights: float32 [max_rows, weight.rows].

    codes int8 [R, K], scales float32 [R, K/32], sums int32 [R, K/32]: per token when `gather` (row r reads token
    row_token[r]), else per grouped row. Padding rows are left as they are in `out` (default: uninitialized).
    `tiles` overrides the kernel's launch shape (`stack.tile_config`); the result does not depend on it.
    """
    fn = grouped_mm_int8_triton if use_triton(codes) else grouped_mm_int8_ref
    return fn(codes, scales, sums, grouping, weight, gather, shared64, out, tiles)


def grouped_mm_int8_triton(codes, scales, sums, grouping, weight, gather, shared64=False, out=None, tiles=None):
    k = codes.shape[1]
    weight.check_dot_length(k)
    spec = weight.spec
    if out is None:
        out = torch.empty(grouping.max_rows, weight.rows, dtype=torch.float32, device=codes.device)
    t = tile_config("mm", spec, weight.rows, codes.is_cuda, tiles)
    grid = (grouping.max_tiles * triton.cdiv(weight.rows, t.bn),)
    if grid[0]:
        _grouped_int8_kernel[grid](
            codes, scales, sums, grouping.row_token, grouping.tile_expert, grouping.n_tiles, weight.raw,
            code_tables(codes.device), out, weight.rows, weight.expert_stride, weight.row_bytes,
            K=k, GATHER=gather, FMT=spec.fmt_id, QK=spec.block_size, TS=spec.type_size, SPLIT16=spec.split16,
            HAS_MIN=spec.has_min, SHARED64=shared64 and spec.scale_per_64, BM=grouping.tile_rows, BN=t.bn, num_warps=t.warps,
            num_stages=t.stages)
    return out


def expert_rows(grouping: Grouping) -> list[tuple[int, torch.Tensor]]:
    """(expert, its grouped rows) for every used expert (the references loop over experts)."""
    counts, starts = grouping.counts.tolist(), grouping.starts.tolist()
    device = grouping.starts.device
    return [(e, torch.arange(starts[e], starts[e] + c, device=device)) for e, c in enumerate(counts) if c]


def grouped_mm_int8_ref(codes, scales, sums, grouping, weight, gather, shared64=False, out=None, tiles=None):
    """float64 products of the dequantized activations and weights, rounded once to float32."""
    if out is None:
        out = torch.zeros(grouping.max_rows, weight.rows, dtype=torch.float32, device=codes.device)
    x = dequantize_rows_int8(codes, scales)
    for e, rows in expert_rows(grouping):
        a = x[grouping.row_token[rows].long()] if gather else x[rows]
        out[rows] = (a @ weight.expert(e).double().T).float()
    return out
