"""Decode attention for short spans in one launch: the split and its merge in the same kernel.

A decode step's attention over a few hundred cells reads ~0.5 MB: its time is latency, and the split-K kernel and
its merge (decode.py) are two launches of it. Here each program takes one (split, KV head, query): a query's
`width` cells (read on the device) are shared evenly among min(max_splits, width / cells) programs, whole chunks
each, a function of the width alone, so a verify window's row computes what its one-query launch does (issue 10).
(`by_span`, for the sweep: over a dense cache each program takes a fixed share of the span, its loads issued before
the width is known and the cells past it masked after; faster for one query, but a row's result then depends on
the launch's span.) With SPLITS > 1 each program writes its partial (max `m`, sum `l` in base 2, the unnormalized
accumulator) and counts itself in a per-(query, KV head) counter; the last to arrive merges the SPLITS partials in
split order (a fixed sequence of ops: the same bytes whichever program is last; partials of programs past a row's
share are exact zeros) and resets the counter for the next launch. The counters live in one zeroed buffer per
device that every launch leaves zero again (so a captured graph replays them).

Dots: QK and PV each "ieee" (fp32 FMA), "tf32", "tf32x3" (3 tensor-core passes, ~fp32) or "native" (the other
operand rounded to the fp16/bf16 cache's dtype: one half-precision pass, fp32 sums). By default, over a fp16 cache
(the engine's default) both dots are native in chunks of 64 cells: a bf16 or fp16 query is exact in fp16 (where
the cache's keys fit), and the probabilities rounded to fp16 (2^-11 relative) move the output by at most 2^-11 of
the values' largest, a quarter of the bf16 step the output is rounded to after (session 16: the A3B step 1.95 ->
1.82 ms, greedy tokens equal to split-K's). Over int8 codes both dots are native too (`_int8_native_step`): QK
one fp16 dot per 64 values (the codes exact in fp16) scaled by their (cell, 64 values) scale after (at D 128 two
2-D dots: the A3B int8 step 1.99 -> 1.94 ms against one batched dot over the groups, session 18), PV over the
codes times their scales rounded to fp16 (as a fp16 cache would hold the values): one more rounding of 2^-11 of
the values' largest; "tf32x3" there dots the codes scaled in fp32. Over a bf16 cache QK takes tf32 (exact for
fp16/bf16 operands: at most 11 significant bits each) and PV tf32x3 (bf16 probabilities would cost the output's own
step); fp32 caches take tf32x3. Bound against float64: the split-K kernel's, plus those roundings
(tests/kernels/attention/test_decode_short.py states it).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from strata.kernels import capability
from strata.kernels.attention.decode_turn import Turn, supported, turn_and_store, turned_queries
from strata.kernels.attention.prompt_parts import LOG2E, rows_block, softmax_step, span_rows
from strata.kernels.pdl import launch_options, pdl_start, pdl_wait


@dataclass(frozen=True)
class ShortConfig:
    """The kernel's tunables (`strata bench decode-attn --sweep` times the alternatives)."""

    cells: int = 64  # cells a program aims at: SPLITS = span / cells, a power of two in 1..max_splits
    max_splits: int = 16  # programs per (KV head, query): each merge reads this many partials
    max_span: int = 2048  # longer spans run split-K (many more programs, and its merge)
    chunk: int = 0  # cells a loop step; 0: 64 where both dots are native (a fp16 MMA's K), else 32
    warps: int = 4
    stages: int = 2
    qk: str = ""  # q.K: "ieee", "tf32", "tf32x3" or "native" (q rounded to the cache's dtype); "": the module's rule
    pv: str = ""  # P.V the same way ("native": P rounded to the cache's dtype)
    by_span: bool = False  # dense, one query: a fixed share of the span, loads not waiting on the width (not row-exact)

    def splits(self, span: int) -> int:
        """Programs per (KV head, query) for a launch over `span` cells (at capture: the span bucket)."""
        want = max(1, triton.cdiv(span, self.cells))  # at least the programs any row of the span takes
        return min(self.max_splits, triton.next_power_of_2(want))

    def cells_a_step(self, native: bool) -> int:
        """The loop's chunk, for dots that are both native or not."""
        return self.chunk or (64 if native else 32)

    def chunk_for(self, qk: str, pv: str, int8: bool, dim: int) -> int:
        """The launch's chunk: `cells_a_step`, native over int8 codes at heads past 128 values taking 32 (64
        spilled at D 256 in sm_90's build)."""
        return self.cells_a_step(qk == pv == "native" and not (int8 and dim > 128))

    def per_program(self, span: int, chunk: int) -> int:
        """Cells of the span each program reads when split by span (whole chunks of `chunk`)."""
        return triton.cdiv(triton.cdiv(span, self.splits(span)), chunk) * chunk

    def takes(self, span: int) -> bool:
        """Whether a span is short enough for this kernel."""
        return span <= self.max_span

    def label(self) -> str:
        return (f"cells={self.cells} max_splits={self.max_splits} max_span={self.max_span} "
                f"chunk={self.chunk or 'auto'} warps={self.warps} stages={self.stages} qk={self.qk or 'auto'} "
                f"pv={self.pv or 'auto'} by_span={int(self.by_span)}")


DEFAULT = ShortConfig()


@triton.jit
def _chunk_step(q, k, v, valid, m, l, acc, scale_log2, QK: tl.constexpr, PV: tl.constexpr):
    """One chunk of the online softmax: q [BM, D] fp32, k [D, CH] and v [CH, D] (fp32, or the cache's fp16/bf16
    for a "native" dot: the other operand rounded to it) -> (m, l, acc) updated."""
    if QK == "native":
        s = tl.dot(q.to(k.dtype), k)
    else:
        s = tl.dot(q, k.to(tl.float32), input_precision=QK)
    e, alpha, m, l = softmax_step(s * scale_log2, valid, m, l)
    if PV == "native":
        pv = tl.dot(e.to(v.dtype), v)
    else:
        pv = tl.dot(e, v.to(tl.float32), input_precision=PV)
    return m, l, acc * alpha[:, None] + pv


@triton.jit
def _codes_as_fp16(codes):
    """int8 codes -> fp16, exactly, without the quarter-rate I2F conversions: the fp16 bits 0x6400 + (c + 128) are
    1152 + c (1024 + n for n < 1024), and 1152 comes off exactly."""
    return (codes.to(tl.int16) + (0x6400 + 128)).to(tl.float16, bitcast=True) - 1152.0


@triton.jit
def _int8_native_step(q3, rows, valid, k_ptr, v_ptr, ks_ptr, vs_ptr, m, l, acc, scale_log2, D: tl.constexpr,
                      CH: tl.constexpr):
    """`_chunk_step` over int8 codes with native dots: q3 [D/64, BM, 64] fp16; QK one fp16 dot per 64 values (the
    codes exact in fp16), each scaled by its (cell, 64 values) scale in fp32 after; V's codes times their scales
    rounded to fp16 (2^-11 relative, as a fp16 cache holds them) for one fp16 PV dot."""
    NG: tl.constexpr = D // 64
    if NG == 2:  # two 2-D dots: a leaner build than the batched dot's layouts and its sum over the groups
        q_lo, q_hi = tl.split(tl.permute(q3, (1, 2, 0)))
        at = rows[None, :] * D + tl.arange(0, 64)[:, None]
        k_lo = _codes_as_fp16(tl.load(k_ptr + at, mask=valid[None, :], other=0))
        k_hi = _codes_as_fp16(tl.load(k_ptr + at + 64, mask=valid[None, :], other=0))
        ks_lo = tl.load(ks_ptr + rows * 2, mask=valid, other=0.0).to(tl.float32)
        ks_hi = tl.load(ks_ptr + rows * 2 + 1, mask=valid, other=0.0).to(tl.float32)
        s = tl.dot(q_lo, k_lo) * ks_lo[None, :] + tl.dot(q_hi, k_hi) * ks_hi[None, :]
    else:
        g = tl.arange(0, NG)[:, None, None]
        k = tl.load(k_ptr + rows[None, None, :] * D + g * 64 + tl.arange(0, 64)[None, :, None],
                    mask=valid[None, None, :], other=0)
        ks = tl.load(ks_ptr + rows[None, None, :] * NG + g, mask=valid[None, None, :], other=0.0).to(tl.float32)
        s = tl.sum(tl.dot(q3, _codes_as_fp16(k)) * ks, axis=0)
    e, alpha, m, l = softmax_step(s * scale_log2, valid, m, l)
    d = tl.arange(0, D)
    v = tl.load(v_ptr + rows[:, None] * D + d[None, :], mask=valid[:, None], other=0)
    vs = tl.load(vs_ptr + rows[:, None] * NG + tl.arange(0, NG)[None, :], mask=valid[:, None], other=0.0)
    # fp16 x fp16 rounded once: the same bytes as the fp32 product rounded to fp16
    v = tl.reshape(tl.reshape(_codes_as_fp16(v), (CH, NG, 64)) * tl.reshape(vs.to(tl.float16), (CH, NG, 1)), (CH, D))
    return m, l, acc * alpha[:, None] + tl.dot(e.to(tl.float16), v)


@triton.jit
def _decode_short_kernel(q_ptr, ids_ptr, width_ptr, page_table_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, acc_ptr, ml_ptr,
                         count_ptr, out_ptr, cap, n_kv_heads, scale_log2, G: tl.constexpr, BM: tl.constexpr,
                         D: tl.constexpr, CH: tl.constexpr, SPLITS: tl.constexpr, INT8: tl.constexpr,
                         DENSE: tl.constexpr, QK: tl.constexpr, PV: tl.constexpr, BY_SPAN: tl.constexpr,
                         PER: tl.constexpr, CELLS: tl.constexpr, MAX_SPLITS: tl.constexpr, PDL: tl.constexpr = 0,
                         IN_ORDER: tl.constexpr = False, turn_k_ptr=None, turn_v_ptr=None, qw_ptr=None, kw_ptr=None,
                         cos_ptr=None, sin_ptr=None, eps=0.0, TURN: tl.constexpr = False, HALF: tl.constexpr = 0):
    pdl_start(PDL)
    pdl_wait(PDL)  # the query, the widths and this step's keys: all written by earlier kernels of the step
    sp = tl.program_id(0)
    kvh = tl.program_id(1)
    qi = tl.program_id(2)
    r = tl.arange(0, BM)
    d = tl.arange(0, D)
    live = r < G
    head = (qi.to(tl.int64) * n_kv_heads + kvh) * G + r
    width = tl.load(width_ptr + qi)
    if TURN:  # STRATA_DECODE_TURN (decode_turn.py): the raw queries turned here (the new key below)
        q = turned_queries(q_ptr, head, live, qw_ptr, cos_ptr, sin_ptr, eps, D, HALF, q_ptr.dtype.element_ty)
    else:
        q = tl.load(q_ptr + head[:, None] * D + d[None, :], mask=live[:, None], other=0.0).to(tl.float32)
    ids_row = ids_ptr + qi.to(tl.int64) * cap
    m = tl.full((BM,), float("-inf"), tl.float32)
    l = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, D), tl.float32)
    if BY_SPAN:  # dense: PER cells of the span each, loaded whatever the width (no wait on it), masked after
        for c in tl.static_range(PER // CH):
            cells = sp * PER + c * CH + tl.arange(0, CH)
            valid = cells < width
            rows = cells.to(tl.int64) * n_kv_heads + kvh
            k = tl.load(k_ptr + rows[None, :] * D + d[:, None], mask=cells[None, :] < cap, other=0)
            v = tl.load(v_ptr + rows[:, None] * D + d[None, :], mask=cells[:, None] < cap, other=0)
            v = tl.where(valid[:, None], v, tl.zeros_like(v))  # cells past the width may hold anything (0 x NaN)
            m, l, acc = _chunk_step(q, k, v, valid, m, l, acc, scale_log2, QK, PV)
    else:  # the width's cells shared evenly among the row's programs, whole chunks each
        # The row's own programs, from its width alone (a verify window's row shares its cells as its one-query
        # launch does, whatever this launch's SPLITS: programs past them add exact zeros to the merge).
        share = tl.minimum(tl.maximum((width + CELLS - 1) // CELLS, 1), MAX_SPLITS)
        per = ((width + share - 1) // share + CH - 1) // CH * CH
        begin = sp * per
        end = tl.minimum(width, begin + per)
        if TURN:  # the program whose cells hold the step's position stores its key and value, then reads them
            if (begin <= width - 1) & (width - 1 < end):
                turn_and_store(turn_k_ptr, turn_v_ptr, kvh, kw_ptr, cos_ptr, sin_ptr, eps, k_ptr, v_ptr, ks_ptr,
                               vs_ptr, page_table_ptr, width - 1, n_kv_heads, D, HALF, q_ptr.dtype.element_ty,
                               not DENSE, INT8)
            tl.debug_barrier()  # its threads' stores before any of its loads (a CTA barrier orders global memory)
        if INT8 and QK == "native":  # the query by 64 values, fp16 (`_int8_native_step`)
            if TURN:
                q3 = tl.permute(tl.reshape(q, (BM, D // 64, 64)), (1, 0, 2)).to(tl.float16)
            else:
                g3 = tl.arange(0, D // 64)[:, None, None]
                q3 = tl.load(q_ptr + head[None, :, None] * D + g3 * 64 + tl.arange(0, 64)[None, None, :],
                             mask=live[None, :, None], other=0.0).to(tl.float16)
        for c0 in range(begin, end, CH):
            rows, valid = span_rows(ids_row, page_table_ptr, c0, end, kvh, n_kv_heads, CH, DENSE, IN_ORDER)
            if INT8 and QK == "native":
                m, l, acc = _int8_native_step(q3, rows, valid, k_ptr, v_ptr, ks_ptr, vs_ptr, m, l, acc, scale_log2,
                                              D, CH)
            else:
                k = tl.load(k_ptr + rows[None, :] * D + d[:, None], mask=valid[None, :], other=0)
                v = tl.load(v_ptr + rows[:, None] * D + d[None, :], mask=valid[:, None], other=0)
                if INT8:  # the codes times their scales, in fp32: one scale a (cell, 64 values), loaded once each
                    NG: tl.constexpr = D // 64
                    g = tl.arange(0, NG)
                    ks = tl.load(ks_ptr + rows[None, :] * NG + g[:, None], mask=valid[None, :], other=0.0)
                    vs = tl.load(vs_ptr + rows[:, None] * NG + g[None, :], mask=valid[:, None], other=0.0)
                    ks, vs = tl.reshape(ks.to(tl.float32), (NG, 1, CH)), tl.reshape(vs.to(tl.float32), (CH, NG, 1))
                    k = tl.reshape(tl.reshape(k.to(tl.float32), (NG, 64, CH)) * ks, (D, CH))
                    v = tl.reshape(tl.reshape(v.to(tl.float32), (CH, NG, 64)) * vs, (CH, D))
                m, l, acc = _chunk_step(q, k, v, valid, m, l, acc, scale_log2, QK, PV)
    out_rows = out_ptr + head[:, None] * D + d[None, :]
    if SPLITS == 1:
        tl.store(out_rows, tl.where(l[:, None] > 0, acc / l[:, None], 0.0).to(out_ptr.dtype.element_ty),
                 mask=live[:, None])
    else:
        part = head * SPLITS + sp  # (query, head, split)
        tl.store(acc_ptr + part[:, None] * D + d[None, :], acc, mask=live[:, None])
        tl.store(ml_ptr + part * 2, m, mask=live)
        tl.store(ml_ptr + part * 2 + 1, l, mask=live)
        tl.debug_barrier()  # every thread's partial is written before the program counts itself (release)
        counter = count_ptr + qi.to(tl.int64) * n_kv_heads + kvh
        if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == SPLITS - 1:
            # The last program: the others' partials are visible (acquire); .cg reads them from L2, not a stale L1.
            first = head * SPLITS
            s = tl.arange(0, SPLITS)
            ms = tl.load(ml_ptr + (first[:, None] + s[None, :]) * 2, mask=live[:, None], other=float("-inf"),
                         cache_modifier=".cg")
            top = tl.max(ms, axis=1)
            top = tl.where(top == float("-inf"), 0.0, top)
            total = tl.zeros((BM,), tl.float32)
            merged = tl.zeros((BM, D), tl.float32)
            for j in tl.static_range(SPLITS):  # in split order: the same sums whichever program merges
                m_j = tl.load(ml_ptr + (first + j) * 2, mask=live, other=float("-inf"), cache_modifier=".cg")
                l_j = tl.load(ml_ptr + (first + j) * 2 + 1, mask=live, other=0.0, cache_modifier=".cg")
                acc_j = tl.load(acc_ptr + (first + j)[:, None] * D + d[None, :], mask=live[:, None], other=0.0,
                                cache_modifier=".cg")
                w = tl.where(m_j == float("-inf"), 0.0, tl.exp2(m_j - top))
                total += w * l_j
                merged += w[:, None] * acc_j
            tl.store(out_rows, tl.where(total[:, None] > 0, merged / total[:, None], 0.0).to(out_ptr.dtype.element_ty),
                     mask=live[:, None])
            tl.store(counter, 0)  # ready for the next launch (a graph's next replay)


COUNTERS = 4096  # (query, KV head) pairs one launch may count: verify windows of 64 rows x 64 KV heads
_counters: dict[torch.device, torch.Tensor] = {}


def arrival_counters(device: torch.device, needed: int) -> torch.Tensor | None:
    """The device's zeroed counters (made on first use, before any capture: a span's first step runs eagerly);
    None if a launch needs more than it holds (the caller takes the split-K path)."""
    if needed > COUNTERS:
        return None
    counters = _counters.get(device)
    if counters is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None  # memory made inside a capture belongs to its graph
        counters = _counters[device] = torch.zeros(COUNTERS, dtype=torch.int32, device=device)
    return counters


def precisions(q: torch.Tensor, cache_dtype: torch.dtype, config: ShortConfig) -> tuple[str, str]:
    """(QK, PV) dot precisions: the config's, else the module's rule (native over a fp16 cache; QK tf32 where its
    inputs are exact in it, else tf32x3); ieee (fp32 FMA) before sm_80, which has no tf32."""
    if capability(q) < (8, 0):
        return "ieee", "ieee"
    halves = (torch.float16, torch.bfloat16)
    exact = q.dtype in halves and cache_dtype in halves
    native = q.dtype in halves and cache_dtype in (torch.float16, torch.int8)
    qk = config.qk or ("native" if native else "tf32" if exact else "tf32x3")
    pv = config.pv or ("native" if native else "tf32x3")
    # A float32 cache has no narrower dtype; over int8 codes the native form takes both dots or neither.
    if cache_dtype == torch.float32 or (cache_dtype == torch.int8 and (qk == "native") != (pv == "native")):
        qk, pv = ("tf32x3" if p == "native" else p for p in (qk, pv))
    return qk, pv


_compiled: set[tuple] = set()  # launch shapes that compiled and ran once
_failed: set[tuple] = set()


def _launch_once_guarded(key: tuple, launch) -> bool:
    """Run `launch`; the first time for `key` (eager: a span's first step runs before its capture), a failure to
    compile is reported in one line and the key left to split-K from then on. False when it did not run."""
    if key in _compiled:
        launch()
        return True
    if key in _failed:
        return False
    try:
        launch()
    except Exception as exc:  # noqa: BLE001  (Triton's compile and ptxas errors have no common base)
        _failed.add(key)
        print(f"strata: decode_short {key} failed to compile ({str(exc).splitlines()[0][:160]}); split-K instead",
              file=sys.stderr)
        return False
    _compiled.add(key)
    return True


def decode_short(q: torch.Tensor, n_kv_heads: int, span: int, pointers: tuple, int8: bool, dense: bool,
                 cache_dtype: torch.dtype, sm_scale: float | None, out_dtype: torch.dtype,
                 config: ShortConfig = DEFAULT, ids_stride: int | None = None,
                 in_order: bool = False, turn: Turn | None = None) -> torch.Tensor | None:
    """The one-launch attention of q [n_q, H, D] over `span` cells (pointers: ids, width, page table, k, v, k scales,
    v scales, as decode.py's split kernel takes them): [n_q, H, D] of out_dtype, or None when the launch cannot
    count its programs (too many (query, KV head) pairs, or the counters not yet made while capturing) or its
    config failed to compile: the caller runs split-K then. `in_order`: a paged cache's ids are every cell in order
    (the static view without a selection): the kernel takes cell j as j, not loading it. `turn` (decode_turn.py):
    q is the projection's raw queries, turned here with the step's key and value (stored at the row's last cell);
    None where the launch cannot take it (the caller then turns and stores them itself)."""
    n_q, n_heads, dim = q.shape
    if turn is not None and not supported(q, turn, dense, in_order, dense and config.by_span):
        return None
    splits = config.splits(span)
    out = torch.empty(n_q, n_heads, dim, dtype=out_dtype, device=q.device)
    if n_q == 0:
        return out
    counters = arrival_counters(q.device, n_q * n_kv_heads)
    if counters is None:
        return None
    if splits > 1:
        acc = torch.empty(n_q, n_heads, splits, dim, dtype=torch.float32, device=q.device)
        ml = torch.empty(n_q, n_heads, splits, 2, dtype=torch.float32, device=q.device)
    else:
        acc = ml = out  # unused
    group = n_heads // n_kv_heads
    scale = 1 / math.sqrt(dim) if sm_scale is None else sm_scale
    by_span = dense and config.by_span
    qk, pv = precisions(q, cache_dtype, config)
    chunk = config.chunk_for(qk, pv, int8, dim)
    meta = dict(G=group, BM=rows_block(group), D=dim, CH=chunk, SPLITS=splits, INT8=int8, DENSE=dense, QK=qk, PV=pv,
                BY_SPAN=by_span, PER=config.per_program(span, chunk) if by_span else 0, CELLS=config.cells,
                MAX_SPLITS=config.max_splits, **({"IN_ORDER": True} if in_order and not dense else {}),
                **({} if turn is None else turn.constants()),
                num_warps=config.warps, num_stages=config.stages, **launch_options(q))
    key = (q.device.type, q.dtype, cache_dtype, *meta.values())

    def launch():
        # cap: the span (dense: loads past it masked) or the ids' row stride (paged)
        cap = span if dense or ids_stride is None else ids_stride
        _decode_short_kernel[(splits, n_kv_heads, n_q)](q.contiguous(), *pointers, acc, ml, counters, out, cap,
                                                        n_kv_heads, scale * LOG2E, **meta,
                                                        **({} if turn is None else turn.arguments()))

    return out if _launch_once_guarded(key, launch) else None
