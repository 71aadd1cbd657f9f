"""Verify windows through the static decode step (engine/decode.py): on CUDA the same captured graphs plain decode
replays, so a window of k rows competes with graphs, not with an eager forward.

Windows shrink when a draft stops early (k = 1..T rows). We keep one GraphDecoder per row count rather than pad every
window to T rows: padded rows would route to experts of their own, and with experts offloaded those join the
window's union of misses (CPU work for tokens nobody reads); they would also cost a full row of matmuls each. The
price is one set of graphs per (rows, span), captured lazily into one shared memory pool.

Each decoder asks its step for the rows' final hidden states (MTP drafting reads them) and for a hybrid cache's
recurrent states after every row (`HybridCache.keep_rows` picks the accepted one), which the step copies into
static buffers shared by all row counts ([T, ...] per GatedDeltaNet layer: the A3B shape's 2 MiB states take
T x 2 MiB a layer, once, not once per captured span). The CPU form (`capture=False`, exact span) runs the very
same functions eagerly and gives the eager window's logits byte for byte.
"""

from __future__ import annotations

import sys

import torch

from strata.engine.decode import decoder_class, graphs_wanted, row_state_buffers
from strata.engine.hybrid_cache import HybridCache
from strata.errors import StrataError


class VerifyWindows:
    """Runs verify windows of 1..max_rows tokens, each row count through its own GraphDecoder (the model's static
    program: DecoderLM's loop, or qwen4exp's Qwen4ExpDecoder)."""

    def __init__(self, model, kv, device: torch.device, capture: bool, max_rows: int, want_hidden: bool):
        pool = torch.cuda.graph_pool_handle() if capture else None
        # One set of row-state buffers for every row count: a window of k rows writes the first k.
        buffers = row_state_buffers(kv, max_rows) if isinstance(kv, HybridCache) else None
        # All made up front: a model or cache without a static form says so here, once, not mid-generation.
        program = decoder_class(model)
        self.decoders = {rows: program(model, kv, device, capture, rows=rows, want_hidden=want_hidden,
                                       keep_row_states=True, pool=pool, row_buffers=buffers)
                         for rows in range(1, max_rows + 1)}

    @property
    def capture(self) -> bool:
        return all(d.capture for d in self.decoders.values())

    @property
    def takes_tail(self) -> bool:
        """Whether a window's drafts may stay on the device (`run`'s `tail`): not for qwen4exp's n-gram rows."""
        return all(d.takes_tail for d in self.decoders.values())

    @property
    def steps(self) -> dict[int, int]:
        """Windows run so far, by row count."""
        return {rows: d.steps for rows, d in self.decoders.items()}

    def run(self, tokens: list[int], start: int, tail: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits float32 [rows, vocab], final hidden states [rows, ...] or None) of the window `tokens` at
        start..; views of static buffers, valid until the next window of the same row count. `tail`: the drafts
        still on the device (GraphDecoder.step)."""
        decoder = self.decoders[len(tokens)]
        logits = decoder.step(tokens, start, tail)
        return logits, decoder.hidden


def make_windows(engine, max_rows: int, want_hidden: bool) -> VerifyWindows | None:
    """The engine's verify windows through the static step, or None (an eager forward per window) when its
    `decode_graphs` option says off or the model / cache has no static form (said in one line)."""
    mode = graphs_wanted(engine.graphs_option, engine.device)
    if mode == "off":
        return None
    try:
        return VerifyWindows(engine.model, engine.kv, engine.device, mode == "graphs", max_rows, want_hidden)
    except StrataError as exc:
        print(f"strata: verify windows step by step: {exc}", file=sys.stderr)
        return None
