"""KV caches seen through static shapes: the decode step's positions are a device tensor, the attention spans a
fixed number of cells (`span`) and masks those past each row's position, so the step captures in a CUDA graph and
replays for any position below the span.

A view wraps the engine's cache (same storage, nothing copied) for one span; the graph runner (engine/decode.py)
keeps the host-side bookkeeping (reserve, a hybrid cache's length) outside the captured step. With `span` equal to
the step's end (what the CPU form uses) every view computes exactly what the cache's own `attend` does, byte for
byte; a larger span adds only masked cells. A step may pass a cell selection (ids [T, W], width [T] on the device,
qwen4exp's indexer): the view then attends over those cells of its span instead of every cell up to the position.
An int8 cache with a Quest selector (`--qsa quest`) selects on the device too: the step's blocks' bounds refreshed
and a fixed span scored (engine/quest.py's static forms), dense while the span fits the budget, as the cache does.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from strata import switches
from strata.engine.hybrid_cache import HybridCache
from strata.engine.kv import KVBackend, KVCache, attend_selected, check_selection
from strata.engine.kv_paged import PagedInt8KV
from strata.errors import StrataError
from strata.kernels.attention.decode import (SHORT_DEFAULT, decode_attn_dense_triton, decode_attn_triton,
                                             dense_split_table, short_config)
from strata.kernels.attention.decode_turn import Turn
from strata.kernels.attention.kv_int8 import append_kv_ref, append_kv_triton, dequantize_int8
from strata.kernels.attention.paged import PAGE, kv_rows
from strata.kernels.attention.prompt import prompt_attention
from strata.kernels.attention.prompt_dense import ROW_EXACT, dense_selected_attention
from strata.kernels.pointwise.chain_qkv_store import chain_qkv_store
from strata.kernels.pointwise.qk_norm_rope_store import (dense_target, paged_target, qk_norm_rope_store_dense,
                                                         qk_norm_rope_store_paged)
from strata.kernels.pointwise.store_kv import store_kv_ref, store_kv_triton
from strata.models.layers import _fused

MIN_SPAN = 256  # spans are powers of two from here up to the context: a handful of graphs per sequence


def span_for(end: int, max_tokens: int) -> int:
    """The attention span of a captured step ending at position `end` (exclusive): the next power of two, at
    least MIN_SPAN, at most the context."""
    span = MIN_SPAN
    while span < end:
        span *= 2
    return min(span, max_tokens)


class StaticView(KVBackend):
    """Common part: the positions [T] (int64, on the device) and the span; growing or rewinding is the runner's."""

    def __init__(self, cache: KVBackend, positions: torch.Tensor, span: int, exact: bool = False):
        """`exact`: the span is the step's end (the CPU form), so a window's row r ends at span - rows + 1 + r."""
        self.exact = exact
        if span > cache.max_tokens:
            raise StrataError(f"attention span {span} exceeds the context of {cache.max_tokens}")
        self.cache, self.positions, self.span = cache, positions, span
        self.max_tokens = cache.max_tokens
        self.cells = torch.arange(span, device=positions.device)
        # The positions as the kernels read them (int32) and each row's width (pos + 1): made once a step by the
        # first layer that attends, not converted again in every layer.
        self.positions32 = torch.zeros(positions.shape, dtype=torch.int32, device=positions.device)
        self.width = torch.zeros(positions.shape, dtype=torch.int32, device=positions.device)
        self._first_layer: int | None = None

    def step_positions(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(positions int32 [T], widths int32 [T]) of this step; the program's first attending layer refreshes them."""
        if self._first_layer is None:
            self._first_layer = layer
        if layer == self._first_layer:
            self.positions32.copy_(self.positions)
            torch.add(self.positions, 1, out=self.width)
        return self.positions32, self.width

    def _lowest_width(self, n_rows: int) -> int:
        """The narrowest row a step of this view can hold: a window's first row (the end past the span below)."""
        if self.exact:
            return max(1, self.span - n_rows + 1)
        below = 1 << (self.span - 1).bit_length() - 1 if self.span > MIN_SPAN else 0  # the largest power of 2 < span
        return max(1, below + 2 - n_rows)

    def _across_reach(self, n_rows: int) -> bool:
        """Whether a window's rows may have run their own steps on both sides of the one-launch decode kernel's reach
        (past it here, below it there): such a window takes both kernels, each row its own step's."""
        return (n_rows > 1 and self.span > SHORT_DEFAULT.max_span and not switches.get("STRATA_DECODE_ATTN_SPLITK")
                and self._lowest_width(n_rows) <= SHORT_DEFAULT.max_span)

    @property
    def n_bytes(self) -> int:
        return self.cache.n_bytes

    def reserve(self, n_tokens: int) -> None:
        """Nothing to do inside a step: the runner reserved the whole context before capturing."""

    def attend_projected(self, layer, x, qkv, heads, norm, config):
        """`attend_normed` of the q, k, v that the stacked projection `qkv` (a gemv.ExpertOperand at stride 0)
        makes of the normed rows x, the projection chained with the norm + RoPE + store in one launch
        (STRATA_DECODE_CHAIN: kernels/pointwise/chain_qkv_store.py); None where the view does not take it."""
        return None

    def truncate(self, length: int) -> None:
        raise StrataError("a static decode view cannot truncate; truncate the engine's cache")


class StaticDenseKV(StaticView):
    """The dense fp16/bf16/fp32 cache (engine/kv.KVCache), whose storage must already hold `span` cells."""

    cache: KVCache

    def __init__(self, cache: KVCache, positions: torch.Tensor, span: int, exact: bool = False):
        super().__init__(cache, positions, span, exact)
        self._row_splits = None
        if positions.is_cuda:
            self._row_split(positions.shape[0])

    def _check_capacity(self) -> None:
        if self.cache.capacity < self.span:
            raise StrataError(f"the KV cache holds {self.cache.capacity} cells, the static span needs {self.span}")

    def attend_projected(self, layer, x, qkv, heads, norm, config):
        if not (_fused(x, norm.q_weight, norm.k_weight, norm.cos, norm.sin) and x.shape[0]):
            return None
        c = self.cache
        self._check_capacity()
        pos32, width = self.step_positions(layer)
        q = chain_qkv_store(x, qkv, heads, norm.q_weight, norm.k_weight, norm.eps, norm.cos, norm.sin,
                            dense_target(heads[1:], c.keys[layer], c.values[layer], pos32), ("qkv", layer), config)
        return None if q is None else self._decode(layer, q, width)

    def attend_normed(self, layer, q, k, v, start, norm):
        """The q/k norm + RoPE, the keys' and values' store and (one more launch) the attention over the cache."""
        if not (norm.fused(q, k, v) and k.shape[0]):
            return super().attend_normed(layer, q, k, v, start, norm)
        c = self.cache
        self._check_capacity()
        pos32, width = self.step_positions(layer)
        if switches.get("STRATA_DECODE_TURN"):  # the norm + RoPE + store inside the attention's launch
            turn = Turn(k, v, norm.q_weight, norm.k_weight, norm.cos, norm.sin, norm.eps)
            out = decode_attn_dense_triton(q, c.keys[layer], c.values[layer], width, self.span, out_dtype=q.dtype,
                                           short=SHORT_DEFAULT, turn=turn)
            if out is not None:
                return out
        q = qk_norm_rope_store_dense(q, k, v, norm.q_weight, norm.k_weight, norm.eps, norm.cos, norm.sin,
                                     c.keys[layer], c.values[layer], pos32)
        return self._decode(layer, q, width)

    def _decode(self, layer, q, width):
        """The decode kernel over each row's cells 0..pos (from the cache), a verify window's rows each what its
        one-token step computes, bit for bit: the one-launch kernel (its programs share a row's cells by the row's
        width) where the rows' own steps took it, split-K with each row's own split (`_row_split`) past its reach."""
        keys, values, n = self.cache.keys[layer], self.cache.values[layer], q.shape[0]
        if short_config(None, SHORT_DEFAULT, self.span) is not None:  # every row's own step took it too
            return decode_attn_dense_triton(q, keys, values, width, self.span, out_dtype=q.dtype,
                                            short=SHORT_DEFAULT)
        split_k = decode_attn_dense_triton(q, keys, values, width, self.span, out_dtype=q.dtype,
                                           row_split=self._row_split(n), short=None)
        if not self._across_reach(n):
            return split_k
        # A window across the one-launch kernel's reach: rows whose own steps took it take it here too.
        reach = dataclasses.replace(SHORT_DEFAULT, max_span=self.span)
        short = decode_attn_dense_triton(q, keys, values, width, self.span, out_dtype=q.dtype, short=reach)
        return torch.where((width <= SHORT_DEFAULT.max_span)[:, None, None], short, split_k)


    def attend(self, layer, q, k, v, start, selection=None):
        c, pos = self.cache, self.positions
        self._check_capacity()
        pos32, width = self.step_positions(layer)
        if _fused(k, v) and k.shape[0]:
            store_kv_triton(c.keys[layer], c.values[layer], pos32, k, v)  # one launch for both casts and stores
        else:
            store_kv_ref(c.keys[layer], c.values[layer], pos, k, v)
        if selection is None and _fused(q):
            # One decode kernel over each row's cells 0..pos, not a dtype copy of the whole span and a masked SDPA.
            # It reads this step's keys back from the cache (an fp16 cache holds bf16 values exactly in its range).
            return self._decode(layer, q, width)
        if selection is not None and c.selected_kernel(q):
            # The selected cells read in place (no copy of the span); one query a program, so a window's rows are
            # the bytes of their own steps (as KVCache.attend's one-token steps).
            ids, width = check_selection(selection, q.shape[0])
            return dense_selected_attention(q, c.keys[layer], c.values[layer], ids, width,
                                            config=ROW_EXACT).to(q.dtype)
        if selection is not None:
            keys = c.keys[layer][: self.span].to(q.dtype).index_copy(0, pos, k)
            values = c.values[layer][: self.span].to(q.dtype).index_copy(0, pos, v)
            return attend_selected(q, keys, values, *check_selection(selection, q.shape[0]))
        if q.shape[0] == 1:
            return self._masked(layer, q, k, v, pos, self.span)
        # A verify window: each row as the one-token step at its position (its own span when exact: the window's
        # positions end at the span), reading the earlier rows' keys as the cache stored them.
        n = q.shape[0]
        return torch.cat([self._masked(layer, q[r:r + 1], k[r:r + 1], v[r:r + 1], pos[r:r + 1],
                                       self.span - n + 1 + r if self.exact else self.span) for r in range(n)])

    def _row_split(self, n_rows: int) -> tuple[torch.Tensor, int]:
        """(the split of each width, on the device; the launch's split count) for rows of this view's steps. Made
        once a view (outside any capture: the table's upload)."""
        if self._row_splits is None:
            table, host = split_table(self.cache.n_kv_heads, self.max_tokens, self.exact, self.positions.device)
            lowest = max(1, self.span - n_rows + 1) if self.exact else 1  # the widths a row of this step can have
            widths, splits = torch.arange(lowest, self.span + 1), host[lowest:self.span + 1]
            self._row_splits = (table, int(((widths + splits - 1) // splits).max()))
        return self._row_splits

    def _masked(self, layer, q, k, v, pos, span):
        """As KVCache.attend: cells 0..span-1 from the cache, this step's keys and values at full precision, cells
        past each row's position masked."""
        c = self.cache
        keys = c.keys[layer][:span].to(q.dtype).index_copy(0, pos, k)
        values = c.values[layer][:span].to(q.dtype).index_copy(0, pos, v)
        allowed = self.cells[None, :span] <= pos[:, None]
        out = F.scaled_dot_product_attention(q.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1),
                                             attn_mask=allowed, enable_gqa=True)
        return out.transpose(0, 1)


class StaticPagedKV(StaticView):
    """The int8 paged cache: append at the device positions (with the q/k norm + RoPE, in one launch, through
    `attend_normed`), then the decode kernel (the reference on the CPU) over cells 0..span-1 with each row's width
    pos + 1 read on the device."""

    cache: PagedInt8KV

    def __init__(self, cache: PagedInt8KV, positions: torch.Tensor, span: int, exact: bool = False):
        super().__init__(cache, positions, span, exact)
        self.ids = self.cells.to(torch.int32)[None].expand(positions.shape[0], span)

    def _kernels(self, q) -> bool:
        c = self.cache
        if len(c.pages) * PAGE < self.span:
            raise StrataError(f"the int8 KV cache holds pages for {len(c.pages) * PAGE} cells, the span needs {self.span}")
        return q.is_cuda if c.kernels is None else c.kernels

    def attend_projected(self, layer, x, qkv, heads, norm, config):
        kernels = self._kernels(x)
        if not (kernels and _fused(x, norm.q_weight, norm.k_weight, norm.cos, norm.sin) and x.shape[0]):
            return None
        pos32, width = self.step_positions(layer)
        target = paged_target(heads[1:], self.cache.pools[layer], self.cache.page_table, pos32)
        q = chain_qkv_store(x, qkv, heads, norm.q_weight, norm.k_weight, norm.eps, norm.cos, norm.sin, target,
                            ("qkv", layer), config)
        return None if q is None else self._attend_stored(layer, q, width, kernels, None)

    def attend_normed(self, layer, q, k, v, start, norm):
        """The q/k norm + RoPE and the keys' and values' store in one launch, then the attention over the pool."""
        kernels = self._kernels(q)
        if not (kernels and norm.fused(q, k, v) and k.shape[0]):
            return super().attend_normed(layer, q, k, v, start, norm)
        pos32, width = self.step_positions(layer)
        c = self.cache
        if switches.get("STRATA_DECODE_TURN") and c.selector is None:  # as StaticDenseKV's (no selection: in order)
            turn = Turn(k, v, norm.q_weight, norm.k_weight, norm.cos, norm.sin, norm.eps)
            out = decode_attn_triton(q, c.pools[layer], c.page_table, self.ids, width, out_dtype=q.dtype,
                                     short=SHORT_DEFAULT, in_order=True, turn=turn)
            if out is not None:
                return out
        q = qk_norm_rope_store_paged(q, k, v, norm.q_weight, norm.k_weight, norm.eps, norm.cos, norm.sin,
                                     c.pools[layer], c.page_table, pos32)
        return self._attend_stored(layer, q, width, kernels, None)

    def attend(self, layer, q, k, v, start, selection=None):
        c = self.cache
        kernels = self._kernels(q)
        pos32, width = self.step_positions(layer)
        (append_kv_triton if kernels else append_kv_ref)(c.pools[layer], c.page_table,
                                                         pos32 if kernels else self.positions, k, v)
        return self._attend_stored(layer, q, width, kernels, selection)

    def _attend_stored(self, layer, q, width, kernels, selection):
        """The attention once this step's keys and values are in the pool."""
        c = self.cache
        pool, table = c.pools[layer], c.page_table
        ids = self.ids
        if c.selector is not None:
            selection = self._quest(layer, q, width, kernels, selection)
        if selection is not None:
            ids, width = (t.to(torch.int32).contiguous() for t in check_selection(selection, q.shape[0]))
        if kernels:
            in_order = selection is None  # self.ids: every cell in order
            out = decode_attn_triton(q, pool, table, ids, width, out_dtype=q.dtype, short=SHORT_DEFAULT,
                                     in_order=in_order)
            if selection is None and self._across_reach(q.shape[0]):  # as StaticDenseKV._decode
                reach = dataclasses.replace(SHORT_DEFAULT, max_span=self.span)
                short = decode_attn_triton(q, pool, table, ids, width, out_dtype=q.dtype, short=reach,
                                           in_order=in_order)
                out = torch.where((width <= SHORT_DEFAULT.max_span)[:, None, None], short, out)
            return out
        # The reference (the CPU form): a window's rows one at a time, each with its one-token step's arithmetic
        # (the reference's products over several queries may sum in another order than over one) and, over every
        # cell (no selection) with an exact span, its own step's cells.
        qf, n = q.float(), q.shape[0]
        cells = [ids.shape[1] - (n - 1 - r if selection is None and self.exact else 0) for r in range(n)]
        return torch.cat([prompt_attention(qf[r:r + 1], pool, table, ids[r:r + 1, :cells[r]], width[r:r + 1],
                                           reference=True) for r in range(n)]).to(q.dtype)

    def _quest(self, layer, q, width, kernels, selection):
        """As the cache's `own_selection`: the bounds of the step's blocks refreshed, then the caller's selection,
        else the Quest selector's cells (None: dense, while the span fits the budget, as the selector's `select`)."""
        c, selector = self.cache, self.cache.selector
        pool, table = c.pools[layer], c.page_table

        def read_cells(cells):  # [T, block] -> keys as stored [T, block, Hkv, D] float32
            rows = kv_rows(table, cells[..., None], torch.arange(c.n_kv_heads, device=cells.device), c.n_kv_heads)
            return dequantize_int8(pool.k[rows], pool.k_scale[rows])

        selector.observe_cells(layer, self.positions, read_cells)
        if selection is not None or self.span <= selector.budget:
            return selection
        return selector.select_span(layer, q, width, self.span, kernels)


_SPLIT_TABLES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def split_table(n_kv_heads: int, max_tokens: int, exact: bool, device: torch.device
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The dense decode attention's split for a one-token step of each width 0..max_tokens (int32, on the device,
    and a host copy): `dense_split` of the span that step attends (its width when exact, else span_for's)."""
    key = (n_kv_heads, max_tokens, exact, torch.device(device))
    kept = _SPLIT_TABLES.get(key)
    if kept is None:
        widths = torch.arange(max_tokens + 1).clamp_min(1)
        spans = widths.clone() if exact else torch.full_like(widths, MIN_SPAN)
        if not exact:
            while bool((spans < widths).any()):  # span_for: powers of two from MIN_SPAN, at most the context
                spans = torch.where(spans < widths, spans * 2, spans)
            spans = spans.clamp_max(max_tokens)
        host = dense_split_table(spans, n_kv_heads)
        kept = _SPLIT_TABLES[key] = (host.to(device), host)
    return kept


def check_static(cache) -> None:
    """A StrataError unless `static_kv` has a view of this cache: the dense or int8 paged backend (not a subclass,
    such as the host-resident one, whose reads it would skip), alone or in a plain HybridCache; a selector only
    on the int8 cache."""
    inner = cache.kv if type(cache) is HybridCache else cache
    if type(inner) not in (KVCache, PagedInt8KV):
        raise StrataError(f"no static decode view for the cache {type(cache).__name__} / {type(inner).__name__}")
    if inner.selector is not None and type(inner) is not PagedInt8KV:
        raise StrataError("a static decode step selects cells (--qsa quest) only over the int8 KV cache")


def static_kv(cache, positions: torch.Tensor, span: int, exact: bool = False) -> KVBackend:
    """The static view of a cache (a KV backend or a HybridCache) for steps at `positions` attending `span` cells
    (`exact`: the span is the step's end)."""
    check_static(cache)
    if type(cache) is HybridCache:
        return StaticHybrid(cache, static_kv(cache.kv, positions, span, exact))
    if type(cache) is KVCache:
        return StaticDenseKV(cache, positions, span, exact)
    return StaticPagedKV(cache, positions, span, exact)


class StaticHybrid(HybridCache):
    """A hybrid cache's GatedDeltaNet states (updated in place, so they capture) beside a static view of its
    attention layers' KV. It shares the cache's state tensors; `begin` is the runner's, outside the step.
    `row_buffers` (layer -> conv [rows, ...], state [rows, ...]): where a verify window leaves each row's states,
    fixed tensors the captured step writes on every replay."""

    row_buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None

    def __init__(self, cache: HybridCache, kv_view: StaticView):  # noqa: the parent's __init__ allocates; we share
        self.__dict__.update(cache.__dict__)
        self.kv = kv_view

    def begin(self, start: int, n_tokens: int) -> None:
        """The runner has already called the real cache's begin (length, reserve) on the host."""

    def keep_row_states(self, layer: int, conv_rows: torch.Tensor, state_rows: torch.Tensor) -> None:
        if self.row_buffers is not None:
            conv, state = self.row_buffers[layer]
            conv.copy_(conv_rows)
            state.copy_(state_rows)
            conv_rows, state_rows = conv, state
        super().keep_row_states(layer, conv_rows, state_rows)
