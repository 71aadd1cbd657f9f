"""The fused int8 gate/up kernel of STRATA_PF_FUSED=1: both projections, SwiGLU and H's int8 rounding in one pass.

Q2_0 weights take the kernels of `fused_q2_0` (gate and up rows as one tile, a wide down projection); this module
launches them and holds the kernel of the other formats. There a program owns 64 grouped rows of one expert and BN
features: it reads each 64-value step of the token's int8 activations once for the gate and the up rows, keeps both
accumulators in registers, and in its epilogue computes
`h = g / (1 + exp(-g)) * u` and rounds h to int8 per 32 features (`round_groups`), in the layout the down
projection reads (`mmq.grouped_mm_int8` with gather=False). H never exists in float in memory.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from strata.errors import StrataError
from strata.kernels.moe.decode import code_tables
from strata.kernels.moe.dispatch import use_triton
from strata.kernels.moe.fused_q2_0 import _down_q2_0_kernel, _gate_up_q2_0_kernel
from strata.kernels.moe.fused_q2_0_fp16 import rounded_fp16
from strata.kernels.moe.grouping import Grouping
from strata.kernels.moe.mmq import (expert_rows, grouped_mm_int8_ref, grouped_mm_int8_triton, load_step,
                                    weights_step)
from strata.kernels.moe.quantize32 import (GROUP, dequantize_rows_int8, quantize_rows_ref, round_groups,
                                          rounded_rows_buffers)
from strata.kernels.moe.stack import ExpertMatrix, Tiles, tile_config
from strata.kernels.work_arena import AllocatorScratch


@triton.jit
def _gate_up_kernel(a, a_scale, a_sum, row_token, tile_expert, n_tiles, wg, wu, tab, hq, hs, hsum,
                    n_ff, expert_bytes, row_bytes,
                    K: tl.constexpr, FMT: tl.constexpr, QK: tl.constexpr, TS: tl.constexpr, SPLIT16: tl.constexpr,
                    HAS_MIN: tl.constexpr, SHARED64: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    pid = tl.program_id(0)
    n_blocks = tl.cdiv(n_ff, BN)
    tile = pid // n_blocks
    if tile >= tl.load(n_tiles):
        return
    expert = tl.load(tile_expert + tile).to(tl.int64)
    rows = tile * BM + tl.arange(0, BM)
    token = tl.load(row_token + rows)
    am = token >= 0
    a_row = tl.where(am, token, 0).to(tl.int64)
    f = (pid % n_blocks) * BN + tl.arange(0, BN)
    fm = f < n_ff
    w_row = f * row_bytes  # int32 offsets from the expert's base: 32-bit address arithmetic per element
    wg_e = wg + expert * expert_bytes
    wu_e = wu + expert * expert_bytes
    acc_g = tl.zeros((BM, BN), tl.float32)
    acc_u = tl.zeros((BM, BN), tl.float32)
    for k0 in range(0, K, 64):
        xc0, xc1, dx0, dx1, xs0, xs1 = load_step(a, a_scale, a_sum, a_row, am, k0, K, HAS_MIN)
        acc_g = weights_step(acc_g, xc0, xc1, dx0, dx1, xs0, xs1, wg_e, w_row, fm, k0, tab,
                             FMT, QK, TS, SPLIT16, HAS_MIN, SHARED64)
        acc_u = weights_step(acc_u, xc0, xc1, dx0, dx1, xs0, xs1, wu_e, w_row, fm, k0, tab,
                             FMT, QK, TS, SPLIT16, HAS_MIN, SHARED64)
    h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    codes, scales, sums = round_groups(h, BM, BN)
    r64 = rows.to(tl.int64)[:, None]
    tl.store(hq + r64 * n_ff + f[None, :], codes, mask=am[:, None] & fm[None, :])
    g = (pid % n_blocks) * (BN // 32) + tl.arange(0, BN // 32)
    gm = am[:, None] & (g[None, :] < n_ff // 32)
    tl.store(hs + r64 * (n_ff // 32) + g[None, :], scales, mask=gm)
    tl.store(hsum + r64 * (n_ff // 32) + g[None, :], sums, mask=gm)


def gate_up_swiglu_int8(codes, scales, sums, grouping: Grouping, gate: ExpertMatrix, up: ExpertMatrix,
                        tiles: Tiles | None = None, out=None, scratch=None, h16: bool = False):
    """H = silu(x Wg^T) * (x Wu^T) of every grouped row, rounded to int8 per 32 features.

    codes, scales, sums: the tokens' int8 activations (`quantize32.quantize_rows`). Returns H's codes int8
    [max_rows, ff], scales float32 [max_rows, ff/32] and code sums int32 [max_rows, ff/32]; padding rows unwritten;
    into `out` (those three tensors) when given. `h16` (Q2_0 gate/up, for an fp16 down kernel: `fp16_h`): the first
    is H's values as fp16 instead, from `scratch` (as the fp16 copy of x that an fp16 gate/up shape reads).
    """
    fn = gate_up_swiglu_int8_triton if use_triton(codes) else gate_up_swiglu_int8_ref
    return fn(codes, scales, sums, grouping, gate, up, tiles, out, scratch, h16)


def fp16_h(down: ExpertMatrix, tiles: Tiles | None, on_gpu: bool) -> bool:
    """Whether the down projection takes H as fp16 values: Q2_0 experts under an fp16 down shape."""
    return down.spec.scale_per_64 and _down_tiles(down.spec, down.rows, on_gpu, tiles).fp16


def down_rows_dtype(down: ExpertMatrix, tiles: Tiles | None, on_gpu: bool) -> torch.dtype:
    """What the down projection's rows are stored as for the combine: fp16 for Q2_0 experts under a down shape with
    "o" (`Tiles.fp16_out`), else float32."""
    fp16 = down.spec.scale_per_64 and _down_tiles(down.spec, down.rows, on_gpu, tiles).fp16_out
    return torch.float16 if fp16 else torch.float32


def gate_up_swiglu_int8_triton(codes, scales, sums, grouping, gate, up, tiles=None, out=None, scratch=None,
                               h16=False):
    if (gate.qtype, gate.rows, gate.cols, gate.expert_stride) != (up.qtype, up.rows, up.cols, up.expert_stride):
        raise StrataError("the fused gate/up kernel needs gate and up experts of one format, shape and stride")
    k, n_ff = codes.shape[1], gate.rows
    gate.check_dot_length(k)
    up.check_dot_length(k)
    if n_ff % GROUP:
        raise StrataError(f"H is rounded per {GROUP} features: {n_ff} is not a multiple")
    spec = gate.spec
    device = codes.device
    scratch = scratch if scratch is not None else AllocatorScratch(device)
    hq, hs, hsum = out if out is not None else rounded_rows_buffers(scratch, grouping.max_rows, n_ff)
    t = tile_config("gate_up", spec, n_ff, codes.is_cuda, tiles)
    if t.bn % GROUP:
        raise StrataError(f"the fused gate/up kernel rounds H per {GROUP} features: {t.bn} features a program")
    grid = (grouping.max_tiles * triton.cdiv(n_ff, t.bn),)
    if grid[0] and spec.scale_per_64:  # Q2_0: gate and up rows as one tile (fused_q2_0)
        a = rounded_fp16(codes, scales, scratch.empty(codes.shape, torch.float16)) if t.fp16 else codes
        if h16:
            hq = scratch.empty((grouping.max_rows, n_ff), torch.float16)
        _gate_up_q2_0_kernel[grid](
            a, scales, grouping.row_token, grouping.tile_expert, grouping.n_tiles, gate.raw, up.raw, hq, hs, hsum,
            n_ff, gate.expert_stride, gate.row_bytes, K=k, TS=spec.type_size, BM=grouping.tile_rows, BN=t.bn,
            ONE_DOT=not t.split, MAGIC=t.magic, FP16=t.fp16, WIDE=_wide(t, k), H16=h16, HALF=t.half, num_warps=t.warps,
            num_stages=t.stages)
    elif grid[0]:
        _gate_up_kernel[grid](
            codes, scales, sums, grouping.row_token, grouping.tile_expert, grouping.n_tiles, gate.raw, up.raw,
            code_tables(device), hq, hs, hsum, n_ff, gate.expert_stride, gate.row_bytes,
            K=k, FMT=spec.fmt_id, QK=spec.block_size, TS=spec.type_size, SPLIT16=spec.split16,
            HAS_MIN=spec.has_min, SHARED64=spec.scale_per_64, BM=grouping.tile_rows, BN=t.bn, num_warps=t.warps,
            num_stages=t.stages)
    return hq, hs, hsum


def gate_up_swiglu_int8_ref(codes, scales, sums, grouping, gate, up, tiles=None, out=None, scratch=None, h16=False):
    """float64 gate and up products of the dequantized activations, SwiGLU in float64, H rounded from float32."""
    h = torch.zeros(grouping.max_rows, gate.rows, dtype=torch.float32, device=codes.device)
    x = dequantize_rows_int8(codes, scales)
    for e, rows in expert_rows(grouping):
        a = x[grouping.row_token[rows].long()]
        g, u = a @ gate.expert(e).double().T, a @ up.expert(e).double().T
        h[rows] = (torch.nn.functional.silu(g) * u).float()
    return quantize_rows_ref(h, out)


def down_int8(codes, scales, sums, grouping: Grouping, down: ExpertMatrix, tiles: Tiles | None = None, out=None):
    """The fused path's down projection of H's int8 rows (one per grouped row): float32 [max_rows, down.rows],
    padding rows unwritten. Q2_0 through the wide kernel of `fused_q2_0`, the other formats through the int8 matmul."""
    fn = down_int8_triton if use_triton(codes) else down_int8_ref
    return fn(codes, scales, sums, grouping, down, tiles, out)


def down_int8_triton(codes, scales, sums, grouping, down, tiles=None, out=None):
    spec = down.spec
    if not spec.scale_per_64:
        if codes.dtype == torch.float16:
            raise StrataError(f"fp16 H (an fp16 fused shape, 'h') needs Q2_0 down experts, not {spec.name}")
        return grouped_mm_int8_triton(codes, scales, sums, grouping, down, False, True, out, tiles)
    k = codes.shape[1]
    down.check_dot_length(k)
    if out is None:
        out = torch.empty(grouping.max_rows, down.rows, dtype=down_rows_dtype(down, tiles, codes.is_cuda),
                          device=codes.device)
    t = _down_tiles(spec, down.rows, codes.is_cuda, tiles)
    if t.fp16 and codes.dtype != torch.float16:  # int8 H (e.g. from the reference gate/up): its fp16 values
        codes = rounded_fp16(codes, scales)
    elif not t.fp16 and codes.dtype == torch.float16:
        raise StrataError("the int8 down kernel needs H as int8 codes, got fp16 values (an fp16 gate/up shape)")
    grid = (grouping.max_tiles * triton.cdiv(down.rows, t.bn),)
    if grid[0]:
        _down_q2_0_kernel[grid](
            codes, scales, grouping.row_token, grouping.tile_expert, grouping.n_tiles, down.raw, out, down.rows,
            down.expert_stride, down.row_bytes, K=k, TS=spec.type_size, BM=grouping.tile_rows, BN=t.bn,
            ONE_DOT=not t.split, MAGIC=t.magic, FP16=t.fp16, WIDE=_wide(t, k), HALF=t.half, num_warps=t.warps,
            num_stages=t.stages)
    return out


def _wide(tiles: Tiles, k: int) -> bool:
    """Two Q2_0 blocks a step (`Tiles.wide`, fp16 shapes) where the dot length allows it."""
    return tiles.fp16 and tiles.wide and k % 128 == 0


def _down_tiles(spec, n_out: int, on_gpu: bool, tiles: Tiles | None) -> Tiles:
    """The fused down projection's launch shape: `tiles.down`, else `tiles`, else the default."""
    return tile_config("down", spec, n_out, on_gpu, tiles if tiles is None else tiles.down or tiles)


def down_int8_ref(codes, scales, sums, grouping, down, tiles=None, out=None):
    return grouped_mm_int8_ref(codes, scales, sums, grouping, down, False, True, out)
