"""qwen4exp's decode step in static form: engine/decode.py's GraphDecoder (token and position buffers, spans, the
expert doorbell, capture and replay) running qwen4exp's own step program (models/qwen4exp.py `forward_residual`).

What the step holds beyond DecoderLM's:

- The n-gram rows. The table stays in its memory-mapped shard behind a host row cache (NgramTable), which no
  graph can read; but the rows depend only on token ids the host already has, so the host hashes and gathers them
  before the replay into a pinned staging buffer, uploaded beside the token. Unlike the routing doorbell this adds
  no wait on the device: the host knows the token once it has sampled the last logits, and the rows with it.
- The hyper-connection stack [1, hc, embd] float32: built from the embedding inside the step, nothing carried.
- QSA: keys and values through the static KV view (engine/static_kv.py); the indexer's raw key written at the
  device position, and the pooled key of the position's block recomputed every step (the host counts it as pooled
  only once the block is complete, as the eager append does). A span of up to `selection_cells` (2,051) cells
  attends densely, as the eager step does there; a longer span runs the indexer's selection every step: scores
  over the span's blocks (those past the position's completed ones count for nothing, the tail takes the dead
  key), the top-k into fixed [1, 2,051] ids with the width on the device, and attention over those cells. Below
  2,051 cells the selection is every cell, which is what dense attention computes.
- GDN conv and recurrent states and the n-gram conv history: updated in place, so they capture.
- MoE: in the one graph when every expert is resident; behind the expert cache, the segments and per-layer
  doorbell of GraphDecoder (every qwen4exp layer routes), with the expert and shared-expert segment it uses.

A verify window (engine/spec_windows.py: rows = 2..4, want_hidden, keep_row_states) runs the same program over its
rows, each row computing the bytes of the one-row step at its position (issue 10): the n-gram rows hashed on the
host for all of them (their tokens must be there: no `tail`), the conv history and token window before the window
kept for keep_rows; GatedDeltaNet rows keep their states in the shared row buffers; QSA (`qsa_window`) writes each
row's indexer key in turn, attends densely through the window's view (which gives every row its own step's decode
attention), and where the row's own step selects, selects by that row alone and attends through a one-row view.

The CPU form (capture=False, exact span) computes the eager step's bytes: tests/engine/test_decode_qwen4exp.py,
and the one-row steps' bytes row by row: tests/engine/test_spec_qwen4exp_windows.py.
"""

from __future__ import annotations

import numpy as np
import torch

from strata.engine.context import ForwardContext
from strata.engine.decode import GraphDecoder, Program, StaticContext, _experts_segment, publish
from strata.engine.qwen4exp_cache import Qwen4ExpCache
from strata.engine.static_kv import MIN_SPAN, StaticHybrid, check_static, static_kv
from strata.errors import StrataError
from strata.kernels.select.keys import BLOCK, pool_keys_at
from strata.models.hyper_connections import MAX_ROWS, hc_write, hc_write_read
from strata.models.layers import route_topk
from strata.models.ngram_embedding import ple_block
from strata.models.qwen4exp_mixers import indexer_select, qsa_output, qsa_project, qwen4exp_gdn
from strata.models.weights import linear, rows_as_steps


class Qwen4ExpDecoder(GraphDecoder):
    """Decode steps (one token) and verify windows (2..4) of a Qwen4ExpLM through static buffers (see the module's
    note); the options are GraphDecoder's."""

    takes_tail = False  # the n-gram rows are hashed on the host: a window's tokens must be there
    takes_head = False  # (the same: a step's token too)

    def __init__(self, model, kv, device: torch.device, capture: bool, rows: int = 1, exact_span: bool | None = None,
                 **options):
        super().__init__(model, kv, device, capture, rows, exact_span, **options)
        embd = model.config.n_embd
        self.ngram_staging = torch.zeros(rows, embd, pin_memory=self.device.type == "cuda")
        self.ngram = torch.zeros(rows, embd, device=self.device)  # the step's n-gram rows, read by the graphs
        # A window's n-gram conv history before it (what keep_rows restores from), a copy queued before its step.
        self.history_before = torch.zeros_like(kv.ple_history) if self.keep_row_states else None
        self.indexer_signature = None
        self.forward_steps = 0  # steps that ran the model's forward (a sequence's first token)

    def _check_model(self, model, kv) -> None:
        if not 1 <= self.rows <= MAX_ROWS:  # the hyper-connection kernels' rows; the n-gram history rolls back 9
            raise StrataError(f"qwen4exp's static decode step runs 1..{MAX_ROWS} tokens, not {self.rows}")
        if type(kv) is not Qwen4ExpCache:
            raise StrataError(f"no static qwen4exp step over the cache {type(kv).__name__}")
        check_static(kv.kv)

    # ---- host side

    def step(self, tokens: list[int], start: int, tail: torch.Tensor | None = None) -> torch.Tensor:
        end = start + self.rows
        if tail is not None:  # the n-gram rows are hashed on the host, from the tokens themselves
            raise StrataError("qwen4exp's static step needs a window's tokens on the host (its n-gram rows)")
        if start == 0:  # a new sequence: its first token sets the indexer's dead key, the prompt path's work
            return self._forward_step(tokens, start)
        if len(tokens) != self.rows:
            raise StrataError(f"this decoder runs steps of {self.rows} tokens, got {len(tokens)}")
        if start != self.kv.length:  # before the n-gram window moves (the hybrid cache would say it too late)
            raise StrataError(f"a recurrent state holds {self.kv.length} tokens and cannot continue at position "
                              f"{start}")
        previous = self.kv.previous_tokens
        if self.keep_row_states:  # queued before the step that moves it
            self.history_before.copy_(self.kv.ple_history)
        self.upload.wait()  # the last step's uploads have left the staging buffers
        self.ngram_staging.copy_(self.model.ngram_rows(np.asarray(tokens, dtype=np.int64), self.kv))
        self.ngram.copy_(self.ngram_staging, non_blocking=True)  # before the token's upload, whose event covers it
        logits = super().step(tokens, start)
        for keys in self.kv.indexer.values():
            keys.n_cells, keys.n_pooled = end, end // BLOCK
        if self.keep_row_states:  # after the step's begin, which forgets any earlier window
            self.kv.mark_window(tokens, self.history_before, previous)
        return logits

    def _forward_step(self, tokens: list[int], start: int) -> torch.Tensor:
        self.forward_steps += 1
        ctx = ForwardContext(self.kv, start, len(tokens), want_all_logits=len(tokens) > 1,
                             want_hidden=self.want_hidden, keep_row_states=self.keep_row_states, tokens=list(tokens))
        with rows_as_steps(len(tokens) > 1):
            logits = self.model.forward(torch.tensor(tokens, device=self.device), ctx)
        self.hidden = ctx.hidden
        return logits

    def dense_reach(self) -> int:
        """The widest step (its end) whose own span QSA attends densely (span <= selection_cells): a step ending
        past it selects cells. Spans grow with the end, so this splits the widths in two."""
        cells = self.model.qsa.selection_cells
        if self.exact_span:
            return cells
        reach, span = 0, MIN_SPAN
        while True:  # span_for's values, from the smallest up
            value = min(span, self.kv.max_tokens)
            if value > cells:
                return reach
            reach = value
            if value == self.kv.max_tokens:
                return reach
            span *= 2

    def _reserve(self, start: int, n_tokens: int) -> None:
        for keys in self.kv.indexer.values():
            keys.reserve(n_tokens)
        super()._reserve(start, n_tokens)
        indexer = self.kv.indexer.values()
        signature = tuple(t.data_ptr() for keys in indexer for t in (keys.raw, keys.pooled, keys.dead))
        signature += (self.kv.ple_history.data_ptr(),)
        if signature != self.indexer_signature:  # storage the graphs write moved: recapture
            self.programs.clear()
            self.indexer_signature = signature

    # ---- the step's functions

    def _program(self, span: int) -> Program:
        model, cache, rows = self.model, self.kv, self.rows
        c, dtype, eps, n_layers = model.config, model.dtype, model.config.rms_eps, model.n_main
        view = StaticHybrid(cache, static_kv(cache.kv, self.positions, span, self.exact_span))
        ctx = StaticContext(view, start=0, n_tokens=rows, want_all_logits=rows > 1, want_hidden=self.want_hidden,
                            keep_row_states=self.keep_row_states, position_tensor=self.positions)
        routed = list(range(n_layers)) if self.cached is not None else []
        stash = self._routing_buffers()
        if self.row_buffers is not None:  # as GraphDecoder's: the rows' states in the shared static buffers
            stash["rows"] = view.window_rows = {}
            view.row_buffers = self.row_buffers
        program = Program([], routed, stash)
        reach = self.dense_reach()
        selects, row_views, row_spans = self._qsa_rows(span, view, reach)

        def mixer(i: int, residual: torch.Tensor, pending) -> tuple[torch.Tensor, tuple]:
            """Layer i's first half: the n-gram block (at its layer), then the hyper-connection read (the pending
            write folded in), GDN or QSA; returns the residual and the half-layer's write, still pending."""
            if i == model.ple_layer:
                residual = hc_write(residual, *pending) if pending else residual
                pending = None
                residual, history = ple_block(residual, self.ngram, model.ple, cache.ple_history, eps)
                cache.ple_history.copy_(history)
            residual, x, inject = hc_write_read(residual, model.hc_attn[i], eps, pending, dtype)
            w = model.mixers[i]
            if model.recurrent[i]:
                y, conv, state = qwen4exp_gdn(w, model.gdn, x, cache.conv[i], cache.state[i], eps,
                                              self.keep_row_states)
                if self.keep_row_states:  # a window: every row's states, the last row's current
                    view.keep_row_states(i, conv, state)
                else:
                    if conv is not cache.conv[i]:  # the decode-step kernel wrote it in place
                        cache.conv[i].copy_(conv)
                    cache.state[i].copy_(state)
            else:
                y = qsa_window(model, i, x, self.positions, stash["cos"], stash["sin"], view,
                               stash["selects"] if selects is None else selects, row_views, row_spans)
            return residual, (y, inject)

        def layers(first: int, stop: int, pending=None) -> None:
            """Layers first..stop-1 whole, then (stop < layers) the mixer of `stop` and its routing, published.
            `pending`: the write (y, inject) the residual still owes, folded into the next read."""
            residual = stash["h"]
            for i in range(first, min(stop, n_layers)):
                residual, pending = mixer(i, residual, pending)
                residual, x, inject = hc_write_read(residual, model.hc_ffn[i], eps, pending, dtype)
                pending = (model._feed_forward(i, x), inject)
            if stop < n_layers:
                residual, pending = mixer(stop, residual, pending)
                residual, x, inject = hc_write_read(residual, model.hc_ffn[stop], eps, pending, dtype)
                stash["inject"], pending = inject, None
                publish(stash, x, *route_topk(linear(x, model.ffn[stop].router), c.n_experts_used, c.norm_topk_prob))
            stash["h"] = residual
            if stop >= n_layers and self.want_hidden:  # the final stack too: the MTP block drafts from it
                stash["hidden"], stash["logits"] = model.final_read(residual, pending)
            elif stop >= n_layers:
                stash["logits"] = model.logits(residual, ctx, pending)

        def first_segment() -> None:
            stash["cos"], stash["sin"] = model.rope.cos_sin(self.positions, dtype)
            if selects is None:  # a window across the dense reach: which rows' own steps select, on the device
                stash["selects"] = self.positions >= reach
            # The residual stack is float32 whatever the compute dtype, as in forward_residual.
            stash["h"] = model.embed_tokens(self.tokens).float()[:, None, :].repeat(1, model.hc, 1)
            layers(0, routed[0] if routed else n_layers)

        program.segments.append(first_segment)
        for j, layer in enumerate(routed):
            program.segments.append(lambda layer=layer: _experts_segment(model, self.cached, layer, stash))
            after = routed[j + 1] if j + 1 < len(routed) else n_layers

            def combine_segment(layer=layer, after=after) -> None:
                part = stash["part"]
                ffn = part + stash["cpu"].to(part.dtype)  # as the eager finish: cached + pool, then + shared
                ffn = model.with_shared(layer, ffn, stash["shared"], stash["x"])
                layers(layer + 1, after, (ffn, stash["inject"]))

            program.segments.append(combine_segment)
        return program

    def _qsa_rows(self, span: int, view: StaticHybrid, reach: int) -> tuple[bool | None, list, list[int]]:
        """How a step at `span` runs its QSA rows: (whether they select: True, False, or None where its rows fall
        on both sides of the dense `reach` (each row's side then read on the device); one-row views of its rows
        and their spans, for rows that select). A row selects when its own step's span is past
        `selection_cells`; in a window at a graph span, a row may have stepped at the span below (static_kv's
        `_lowest_width`)."""
        rows = self.rows
        if span <= reach:
            return False, [], []
        if rows == 1:  # the step's own view
            return True, [view], [span]
        first = span - rows  # (exact span) the window's first position
        spans = [self.step_span(first + r + 1) if self.exact_span else span for r in range(rows)]
        views = [StaticHybrid(self.kv, static_kv(self.kv.kv, self.positions[r:r + 1], s, self.exact_span))
                 for r, s in enumerate(spans)]
        return (True if view.kv._lowest_width(rows) > reach else None), views, spans


def qsa_window(model, i: int, x: torch.Tensor, positions: torch.Tensor, cos, sin, view, selects, row_views,
               row_spans: list[int]) -> torch.Tensor:
    """QSA layer i of a static step's rows x [T, embd] at `positions` [T], each what the one-row step computes at
    its position (issue 10): its indexer key written (its block's pooled key recomputed) in turn; then, where the
    row's own step attends densely, the decode attention through the step's `view` (which gives every row its own
    step's); where it selects (`selects`: True, False, or bool [T] on the device), the row's selection alone
    (scoring the pooled keys of its span, row_spans[r]) and its attention through its one-row view row_views[r],
    which reads the earlier rows' keys as the cache stored them, as the row's step did."""
    w, s, keys, eps = model.mixers[i], model.qsa, view.indexer[i], model.config.rms_eps
    for r in range(x.shape[0]):
        write_indexer_key(keys, positions[r:r + 1], linear(x[r:r + 1], w.indexer_k), w.indexer_k_norm)
    q, k, v, gate = qsa_project(w, s, x, cos, sin, eps)
    dense = None if selects is True else view.attend(i, q, k, v, 0)
    if selects is False:
        return qsa_output(w, s, dense, gate)
    rows = []
    for r, (one, span) in enumerate(zip(row_views, row_spans)):
        at = slice(r, r + 1)
        selection = indexer_select(w, s, x[at], positions[at], keys.pooled[: span // BLOCK], keys.dead, eps)
        rows.append(one.attend(i, q[at], k[at], v[at], 0, selection))
    out = torch.cat(rows) if len(rows) > 1 else rows[0]
    if dense is not None:
        out = torch.where(selects[:, None, None], out, dense)
    return qsa_output(w, s, out, gate)


def write_indexer_key(keys, positions: torch.Tensor, raw: torch.Tensor, k_norm: torch.Tensor) -> None:
    """The indexer's raw key [1, Dk] of the cell at `positions` [1] (device), and the pooled key of its block over
    the block's cells so far (final once the block is complete; the host counts it only then). Storage reserved."""
    keys.raw.index_copy_(0, positions, raw.float())
    first = positions // BLOCK * BLOCK
    cells = keys.raw.index_select(0, first + torch.arange(BLOCK, device=positions.device))
    keys.pooled.index_copy_(0, positions // BLOCK, pool_keys_at(cells, k_norm, first, keys.eps, keys.n_rot, keys.base))
