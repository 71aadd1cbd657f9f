"""Decode attention over selected cells: split-K over the selection, then a log-sum-exp merge.

Each program takes one (split of `split` cells, KV head, query): fp32 math as the fp32 prompt kernel (same chunks,
same order), writing its running max `m`, sum `l` (base 2) and unnormalized accumulator. The merge scales each split
by `exp2(m_s - max m)`. With one split the result is the fp32 prompt kernel's, bit for bit. int8 or fp16 pools, or
(DENSE) the dense cache's [cells, KV heads, D] tensors of any float dtype, cells 0..width-1 of each query.
Reference: `prompt_ref.prompt_attn_ref` (the same attention, one query at a time).

Spans up to `ShortConfig.takes` run decode_short.py's one-launch kernel instead (split and merge in one kernel,
tensor-core dots) unless a split is given or `STRATA_DECODE_ATTN_SPLITK` is set.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from strata import switches
from strata.kernels.attention.decode_short import DEFAULT as SHORT_DEFAULT
from strata.kernels.attention.decode_short import ShortConfig, decode_short
from strata.kernels.attention.decode_turn import Turn
from strata.kernels.attention.paged import PagedKV
from strata.kernels.attention.prompt_parts import CHUNK, LOG2E, check_inputs, rows_block, softmax_step, span_rows
from strata.kernels.attention.prompt_ref import prompt_attn_ref

SPLIT = 128  # cells per program


@triton.jit
def _decode_split_kernel(q_ptr, ids_ptr, width_ptr, page_table_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, acc_ptr, ml_ptr,
                         cap, n_kv_heads, n_splits, scale_log2, G: tl.constexpr, BM: tl.constexpr, D: tl.constexpr,
                         CH: tl.constexpr, SPLIT: tl.constexpr, INT8: tl.constexpr, DENSE: tl.constexpr = False,
                         split_ptr=None, ROW_SPLIT: tl.constexpr = False):
    sp = tl.program_id(0)
    kvh = tl.program_id(1)
    qi = tl.program_id(2)
    r = tl.arange(0, BM)
    d = tl.arange(0, D)
    head = (qi.to(tl.int64) * n_kv_heads + kvh) * G + r
    q = tl.load(q_ptr + head[:, None] * D + d[None, :], mask=r[:, None] < G, other=0.0).to(tl.float32)
    width = tl.load(width_ptr + qi)
    # ROW_SPLIT: each query's split read by its width (the one-query step's own split at that width: a verify
    # window's rows then sum as their decode steps do), else SPLIT for all.
    if ROW_SPLIT:
        split = tl.load(split_ptr + width)
    else:
        split = SPLIT
    end = tl.minimum(width, (sp + 1) * split)
    ids_row = ids_ptr + qi.to(tl.int64) * cap
    m = tl.full((BM,), float("-inf"), tl.float32)
    l = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, D), tl.float32)
    for c0 in range(sp * split, end, CH):
        rows, valid = span_rows(ids_row, page_table_ptr, c0, end, kvh, n_kv_heads, CH, DENSE)
        k = tl.load(k_ptr + rows[None, :] * D + d[:, None], mask=valid[None, :], other=0).to(tl.float32)
        v = tl.load(v_ptr + rows[:, None] * D + d[None, :], mask=valid[:, None], other=0).to(tl.float32)
        if INT8:
            k *= tl.load(ks_ptr + rows[None, :] * (D // 64) + d[:, None] // 64, mask=valid[None, :], other=0.0)
            v *= tl.load(vs_ptr + rows[:, None] * (D // 64) + d[None, :] // 64, mask=valid[:, None], other=0.0)
        s = tl.dot(q, k, input_precision="ieee") * scale_log2
        e, alpha, m, l = softmax_step(s, valid, m, l)
        acc = acc * alpha[:, None] + tl.dot(e, v, input_precision="ieee")
    part = head * n_splits + sp  # (query, head, split)
    tl.store(acc_ptr + part[:, None] * D + d[None, :], acc, mask=r[:, None] < G)
    tl.store(ml_ptr + part * 2, m, mask=r < G)
    tl.store(ml_ptr + part * 2 + 1, l, mask=r < G)


@triton.jit
def _decode_merge_kernel(acc_ptr, ml_ptr, out_ptr, n_splits, D: tl.constexpr, S: tl.constexpr):
    head = tl.program_id(0).to(tl.int64)  # (query, head) flattened
    sp = tl.arange(0, S)
    d = tl.arange(0, D)
    live = sp < n_splits
    part = head * n_splits + sp
    m = tl.load(ml_ptr + part * 2, mask=live, other=float("-inf"))
    l = tl.load(ml_ptr + part * 2 + 1, mask=live, other=0.0)
    top = tl.max(m, axis=0)
    w = tl.where(m == float("-inf"), 0.0, tl.exp2(m - tl.where(top == float("-inf"), 0.0, top)))
    total = tl.sum(w * l, axis=0)
    acc = tl.sum(tl.load(acc_ptr + part[:, None] * D + d[None, :], mask=live[:, None], other=0.0) * w[:, None], 0)
    tl.store(out_ptr + head * D + d, tl.where(total > 0, acc / total, 0.0).to(out_ptr.dtype.element_ty))


MERGE_BLOCK = 16  # splits the decode merge reduces at once


@triton.jit
def _decode_merge_blocks_kernel(acc_ptr, ml_ptr, out_ptr, n_splits, D: tl.constexpr, S: tl.constexpr):
    """The merge in blocks of S splits, the blocks' sums added in order: a query's result is the same whatever
    the launch's split count, since splits past its cells (m = -inf, l = 0, acc = 0) add exact zeros. (One tree
    over next_power_of_2(n_splits) splits would change its order with the count, i.e. with the span or rows.)"""
    head = tl.program_id(0).to(tl.int64)  # (query, head) flattened
    d = tl.arange(0, D)
    top = tl.max(tl.full((S,), float("-inf"), tl.float32), axis=0)
    for s0 in range(0, n_splits, S):
        sp = s0 + tl.arange(0, S)
        top = tl.maximum(top, tl.max(tl.load(ml_ptr + (head * n_splits + sp) * 2, mask=sp < n_splits,
                                             other=float("-inf")), axis=0))
    shift = tl.where(top == float("-inf"), 0.0, top)
    total = tl.sum(tl.zeros((S,), tl.float32), axis=0)
    acc = tl.zeros((D,), tl.float32)
    for s0 in range(0, n_splits, S):
        sp = s0 + tl.arange(0, S)
        live = sp < n_splits
        part = head * n_splits + sp
        m = tl.load(ml_ptr + part * 2, mask=live, other=float("-inf"))
        l = tl.load(ml_ptr + part * 2 + 1, mask=live, other=0.0)
        w = tl.where(m == float("-inf"), 0.0, tl.exp2(m - shift))
        total += tl.sum(w * l, axis=0)
        acc += tl.sum(tl.load(acc_ptr + part[:, None] * D + d[None, :], mask=live[:, None], other=0.0) * w[:, None], 0)
    tl.store(out_ptr + head * D + d, tl.where(total > 0, acc / total, 0.0).to(out_ptr.dtype.element_ty))


def merge_splits(parts: torch.Tensor, ml: torch.Tensor, out: torch.Tensor) -> None:
    """Split-K partials (unscaled acc [rows, S, D], m and l [rows, S, 2], base 2) -> out [rows, D] (its dtype):
    `sum_s w_s acc_s / sum_s w_s l_s`, `w_s = exp2(m_s - max m)`, the splits in order (deterministic)."""
    rows, n_splits, dim = parts.shape
    if rows:
        _decode_merge_kernel[(rows,)](parts, ml, out, n_splits, D=dim, S=triton.next_power_of_2(n_splits), num_warps=4)


def _split_and_merge(q: torch.Tensor, n_kv_heads: int, cells: int, split: int, sm_scale: float | None,
                     pointers: tuple, int8: bool, dense: bool, out_dtype: torch.dtype = torch.float32,
                     row_split: tuple[torch.Tensor, int] | None = None,
                     ids_stride: int | None = None) -> torch.Tensor:
    """The split kernel over `cells` cells in splits of `split` (pointers: ids, width, page table, k, v, k scales,
    v scales), then the merge: [n_q, H, D] of out_dtype (the fp32 result rounded once; q is read in its own dtype,
    exact in fp32, so neither side needs a conversion launch). `row_split` (table, n_splits): each query's split
    read from table[width], over a launch of n_splits splits."""
    n_q, n_heads, dim = q.shape
    scale = 1 / math.sqrt(dim) if sm_scale is None else sm_scale
    out = torch.empty(n_q, n_heads, dim, dtype=out_dtype, device=q.device)
    n_splits = triton.cdiv(max(cells, 1), split) if row_split is None else row_split[1]
    if n_q == 0:
        return out
    acc = torch.empty(n_q, n_heads, n_splits, dim, dtype=torch.float32, device=q.device)
    ml = torch.empty(n_q, n_heads, n_splits, 2, dtype=torch.float32, device=q.device)
    group = n_heads // n_kv_heads
    extra = {} if row_split is None else dict(split_ptr=row_split[0], ROW_SPLIT=True)
    _decode_split_kernel[(n_splits, n_kv_heads, n_q)](
        q.contiguous(), *pointers, acc, ml, cells if ids_stride is None else ids_stride, n_kv_heads, n_splits,
        scale * LOG2E, G=group, BM=rows_block(group), D=dim, CH=CHUNK, SPLIT=split, INT8=int8, DENSE=dense,
        num_warps=8, num_stages=2, **extra)
    _decode_merge_blocks_kernel[(n_q * n_heads,)](acc, ml, out, n_splits, D=dim, S=MERGE_BLOCK, num_warps=4)
    return out


def short_config(split: int | None, short: ShortConfig | None, span: int) -> ShortConfig | None:
    """The one-launch kernel's config for this call, or None for split-K (a split given, the switch, a long span)."""
    if split is not None or short is None or switches.get("STRATA_DECODE_ATTN_SPLITK"):
        return None
    return short if short.takes(span) else None


def decode_attn_triton(q: torch.Tensor, pool: PagedKV, page_table: torch.Tensor, ids: torch.Tensor,
                       width: torch.Tensor, sm_scale: float | None = None, split: int | None = None,
                       out_dtype: torch.dtype = torch.float32,
                       short: ShortConfig | None = SHORT_DEFAULT, in_order: bool = False,
                       turn: Turn | None = None) -> torch.Tensor | None:
    """Attention of a few queries [n_q, H, D] (any float dtype) over their selected cells: [n_q, H, D] of
    out_dtype (fp32 accumulation either way). Short selections (`short.takes(cap)`) in one launch, others (or a
    given `split`) split-K and merged. `in_order`: every row's ids are 0, 1, 2, ... (the one launch then does not
    load them). `turn` (STRATA_DECODE_TURN, with `in_order`): as `decode_attn_dense_triton`'s, into the pool."""
    check_inputs(q, pool, ids, width)
    if split is not None and split % CHUNK:
        raise ValueError(f"split {split} is not a multiple of {CHUNK}")
    scales = (pool.k_scale, pool.v_scale) if pool.int8 else (pool.k, pool.v)  # unused pointers for fp16
    # Rows read at a stride: the static view's ids (every query the same cells, an expanded row) need no copy.
    ids = ids if ids.dtype == torch.int32 and ids.stride(-1) == 1 else ids.to(torch.int32).contiguous()
    pointers = (ids, width.to(torch.int32).contiguous(), page_table.to(torch.int32).contiguous(), pool.k, pool.v,
                *scales)
    config = short_config(split, short, ids.shape[1])
    if config is not None:
        out = decode_short(q, pool.n_kv_heads, ids.shape[1], pointers, pool.int8, False, pool.k.dtype, sm_scale,
                           out_dtype, config, ids_stride=ids.stride(0), in_order=in_order, turn=turn)
        if out is not None:
            return out
    if turn is not None:  # split-K does not turn: the caller does, then attends
        return None
    return _split_and_merge(q, pool.n_kv_heads, ids.shape[1], split or SPLIT, sm_scale, pointers, pool.int8,
                            dense=False, out_dtype=out_dtype, ids_stride=ids.stride(0))


PROGRAMS = 128  # about one program per SM of a large GPU: short spans split finer so the launch fills it
MAX_SPLITS = 256  # the merge holds every split's row of one head at once: long spans take longer splits


def dense_split(span: int, n_kv_heads: int, n_queries: int) -> int:
    """Cells per program for a dense decode launch: SPLIT, or fewer (a multiple of CHUNK) when span / SPLIT splits
    times the KV heads and queries would leave most of the GPU idle (a 256-cell span with 4 KV heads: 8 programs)."""
    per_program = span * n_kv_heads * n_queries // PROGRAMS
    split = max(CHUNK, min(SPLIT, per_program // CHUNK * CHUNK))
    return max(split, triton.cdiv(triton.cdiv(span, MAX_SPLITS), CHUNK) * CHUNK)


def dense_split_table(spans: torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """`dense_split(span, n_kv_heads, 1)` of every entry of `spans` (int64): int32, the same values."""
    per_program = spans * n_kv_heads // PROGRAMS
    split = (per_program // CHUNK * CHUNK).clamp(CHUNK, SPLIT)
    longest = -(-(-(-spans // MAX_SPLITS)) // CHUNK) * CHUNK
    return torch.maximum(split, longest).to(torch.int32)


def decode_attn_dense_triton(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, width: torch.Tensor,
                             span: int, sm_scale: float | None = None, split: int | None = None,
                             out_dtype: torch.dtype = torch.float32,
                             row_split: tuple[torch.Tensor, int] | None = None,
                             short: ShortConfig | None = SHORT_DEFAULT,
                             turn: Turn | None = None) -> torch.Tensor | None:
    """Attention of queries q [n_q, H, D] over cells 0..width[i]-1 (width read on the device, at most `span`: the
    launch's bound) of a dense cache keys/values [cells, Hkv, D]: [n_q, H, D] of out_dtype. A captured decode
    step's attention: one launch (short spans; each row's cells shared among programs by its own width, so a
    verify window's row is its one-query launch bit for bit) or split-K and its merge, in place of torch's masked
    attention over the whole span. `split` (cells a program) forces split-K, and so does `row_split` (int32 table by
    width on q's device, the launch's split count): split-K's rows each take the split of their width (a verify window's
    row the split its own one-query step takes), in place of one split for all. `turn` (STRATA_DECODE_TURN,
    decode_turn.py): q is the projection's raw queries, turned in the one launch with the step's key and value (which
    it stores); None where that launch does not take them (the caller turns and stores them, then attends)."""
    n_q, n_heads, dim = q.shape
    n_kv_heads = keys.shape[1]
    if keys.shape != values.shape or keys.shape[2] != dim or n_heads % n_kv_heads or span > keys.shape[0]:
        raise ValueError(f"queries {tuple(q.shape)} do not fit keys {tuple(keys.shape)} / values "
                         f"{tuple(values.shape)} over a span of {span}")
    if not (keys.is_contiguous() and values.is_contiguous()):
        raise ValueError("the dense cache's keys and values must be contiguous")
    width = width.to(torch.int32)
    # ids, page table and scales are unused in the dense form: any valid pointer stands in for them.
    pointers = (width, width, width, keys, values, keys, values)
    config = short_config(split, short, span) if row_split is None else None  # a row split is split-K's
    if config is not None:
        out = decode_short(q, n_kv_heads, span, pointers, False, True, keys.dtype, sm_scale, out_dtype, config,
                           turn=turn)
        if out is not None:
            return out
    if turn is not None:  # split-K does not turn: the caller does, then attends
        return None
    split = dense_split(span, n_kv_heads, n_q) if split is None else split
    return _split_and_merge(q, n_kv_heads, span, split, sm_scale, pointers, int8=False, dense=True,
                            out_dtype=out_dtype, row_split=row_split)


def decode_attention(q: torch.Tensor, pool: PagedKV, page_table: torch.Tensor, ids: torch.Tensor,
                     width: torch.Tensor, sm_scale: float | None = None) -> torch.Tensor:
    """Decode attention: the split-K kernel on the GPU, the reference (fp32) on the CPU."""
    if q.is_cuda:
        return decode_attn_triton(q, pool, page_table, ids, width, sm_scale)
    return prompt_attn_ref(q, pool, page_table, ids, width, sm_scale, dtype=torch.float32)
