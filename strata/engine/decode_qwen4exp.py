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

The CPU form (capture=False, exact span) computes the eager step's bytes: tests/engine/test_decode_qwen4exp.py.
"""

from __future__ import annotations

import numpy as np
import torch

from strata.engine.context import ForwardContext
from strata.engine.decode import GraphDecoder, Program, StaticContext, _experts_segment, publish
from strata.engine.qwen4exp_cache import Qwen4ExpCache
from strata.engine.static_kv import StaticHybrid, check_static, static_kv
from strata.errors import StrataError
from strata.kernels.select.keys import BLOCK, pool_keys_at
from strata.models.hyper_connections import hc_write, hc_write_read
from strata.models.layers import route_topk
from strata.models.ngram_embedding import ple_block
from strata.models.qwen4exp_mixers import indexer_select, qsa_attention, qwen4exp_gdn
from strata.models.weights import linear


class Qwen4ExpDecoder(GraphDecoder):
    """One-token decode steps of a Qwen4ExpLM through static buffers (see the module's note)."""

    def __init__(self, model, kv, device: torch.device, capture: bool, rows: int = 1, exact_span: bool | None = None):
        super().__init__(model, kv, device, capture, rows, exact_span)
        embd = model.config.n_embd
        self.ngram_staging = torch.zeros(rows, embd, pin_memory=self.device.type == "cuda")
        self.ngram = torch.zeros(rows, embd, device=self.device)  # the step's n-gram rows, read by the graphs
        self.indexer_signature = None
        self.forward_steps = 0  # steps that ran the model's forward (a sequence's first token)

    def _check_model(self, model, kv) -> None:
        if self.rows != 1:
            raise StrataError(f"qwen4exp's static decode step runs one token, not {self.rows}")
        if type(kv) is not Qwen4ExpCache:
            raise StrataError(f"no static qwen4exp step over the cache {type(kv).__name__}")
        check_static(kv.kv)

    # ---- host side

    def step(self, tokens: list[int], start: int) -> torch.Tensor:
        end = start + self.rows
        if start == 0:  # a new sequence: its first token sets the indexer's dead key, the prompt path's work
            return self._forward_step(tokens, start)
        if len(tokens) != self.rows:
            raise StrataError(f"this decoder runs steps of {self.rows} tokens, got {len(tokens)}")
        if start != self.kv.length:  # before the n-gram window moves (the hybrid cache would say it too late)
            raise StrataError(f"a recurrent state holds {self.kv.length} tokens and cannot continue at position "
                              f"{start}")
        self.upload.wait()  # the last step's uploads have left the staging buffers
        self.ngram_staging.copy_(self.model.ngram_rows(np.asarray(tokens, dtype=np.int64), self.kv))
        self.ngram.copy_(self.ngram_staging, non_blocking=True)  # before the token's upload, whose event covers it
        logits = super().step(tokens, start)
        for keys in self.kv.indexer.values():
            keys.n_cells, keys.n_pooled = end, end // BLOCK
        return logits

    def _forward_step(self, tokens: list[int], start: int) -> torch.Tensor:
        self.forward_steps += 1
        ctx = ForwardContext(self.kv, start, len(tokens), want_all_logits=len(tokens) > 1)
        return self.model.forward(torch.tensor(tokens, device=self.device), ctx)

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
        ctx = StaticContext(StaticHybrid(cache, static_kv(cache.kv, self.positions, span)), start=0, n_tokens=rows,
                            want_all_logits=rows > 1, position_tensor=self.positions)
        routed = list(range(n_layers)) if self.cached is not None else []
        stash = self._routing_buffers()
        program = Program([], routed, stash)

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
                y, conv, state = qwen4exp_gdn(w, model.gdn, x, cache.conv[i], cache.state[i], eps)
                if conv is not cache.conv[i]:  # the decode-step kernel wrote it in place
                    cache.conv[i].copy_(conv)
                cache.state[i].copy_(state)
            else:
                keys = cache.indexer[i]
                write_indexer_key(keys, self.positions, linear(x, w.indexer_k), w.indexer_k_norm)
                selection = None
                if span > model.qsa.selection_cells:  # exact span: the eager step's own test (end > 2,051)
                    selection = indexer_select(w, model.qsa, x, self.positions, keys.pooled[: span // BLOCK],
                                               keys.dead, eps)
                y = qsa_attention(w, model.qsa, x, ctx.kv, i, 0, stash["cos"], stash["sin"], selection, eps)
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
            if stop >= n_layers:
                stash["logits"] = model.logits(residual, ctx, pending)

        def first_segment() -> None:
            stash["cos"], stash["sin"] = model.rope.cos_sin(self.positions, dtype)
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


def write_indexer_key(keys, positions: torch.Tensor, raw: torch.Tensor, k_norm: torch.Tensor) -> None:
    """The indexer's raw key [1, Dk] of the cell at `positions` [1] (device), and the pooled key of its block over
    the block's cells so far (final once the block is complete; the host counts it only then). Storage reserved."""
    keys.raw.index_copy_(0, positions, raw.float())
    first = positions // BLOCK * BLOCK
    cells = keys.raw.index_select(0, first + torch.arange(BLOCK, device=positions.device))
    keys.pooled.index_copy_(0, positions // BLOCK, pool_keys_at(cells, k_norm, first, keys.eps, keys.n_rot, keys.base))


def qsa_rows_as_steps(model, i: int, x: torch.Tensor, cache: Qwen4ExpCache, positions: torch.Tensor, cos, sin,
                      decoder: Qwen4ExpDecoder) -> torch.Tensor:
    """A verify window's QSA layer i (eager forward) where plain decoding runs `decoder`'s static step: row by row,
    each row what that step computes at its position (issue 10: bit for bit): its indexer key written and its
    block's pooled key recomputed, the selection by the step's own span (dense up to `selection_cells`), the
    attention through a one-row static view of that span (the decode kernel where the step takes it). A window of
    k rows costs k one-row attentions; the window's other ops already compute each row as its step."""
    w, keys, eps = model.mixers[i], cache.indexer[i], model.config.rms_eps
    n, first = x.shape[0], int(positions[0])
    end = first + n
    widest = decoder.step_span(end)  # spans grow with the end: the last row's covers every row's
    keys.reserve(widest)
    cache.kv.reserve(widest)
    rows = []
    for r in range(n):
        position, span = positions[r:r + 1], decoder.step_span(first + r + 1)
        view = StaticHybrid(cache, static_kv(cache.kv, position, span, decoder.exact_span))
        one = x[r:r + 1]
        write_indexer_key(keys, position, linear(one, w.indexer_k), w.indexer_k_norm)
        selection = None
        if span > model.qsa.selection_cells:
            selection = indexer_select(w, model.qsa, one, position, keys.pooled[: span // BLOCK], keys.dead, eps)
        rows.append(qsa_attention(w, model.qsa, one, view, i, 0, cos[r:r + 1], sin[r:r + 1], selection, eps))
    keys.n_cells, keys.n_pooled = end, end // BLOCK
    return torch.cat(rows)
