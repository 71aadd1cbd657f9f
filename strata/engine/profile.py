"""`strata profile`: how often each expert is routed to on a text, saved for filling the expert cache at start."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from strata.engine.experts import ExpertBackend, PendingExperts


class CountingExperts(ExpertBackend):
    """Wraps a backend and counts, per layer, the (token, expert) routings it is asked for."""

    name = "counting"

    def __init__(self, inner: ExpertBackend, n_experts: int):
        self.inner, self.n_experts = inner, n_experts
        self.counts: dict[int, torch.Tensor] = {}

    def start(self, layer, x, weights, ids) -> PendingExperts:
        row = self.counts.setdefault(layer, torch.zeros(self.n_experts, dtype=torch.long))
        row += torch.bincount(ids.reshape(-1).cpu(), minlength=self.n_experts)
        return self.inner.start(layer, x, weights, ids)

    def end_step(self) -> None:
        self.inner.end_step()


def profile_routing(engine, text: str, output: str | Path) -> dict:
    """Read `text` through the prompt path and write {"model", "tokens", "counts": {layer: [count per expert]}}."""
    model = engine.model
    counting = CountingExperts(model.experts, model.config.n_experts)
    model.experts = counting
    store, engine.checkpoints = engine.checkpoints, None  # every token routed: none taken from a checkpoint
    try:
        ids = engine.tokenizer.encode(text)[: engine.n_ctx]
        engine.cached_tokens = []
        engine.prefill(ids)
    finally:
        model.experts, engine.checkpoints = counting.inner, store
    result = {
        "model": str(engine.file.path.name),
        "tokens": len(ids),
        "counts": {str(layer): row.tolist() for layer, row in sorted(counting.counts.items())},
    }
    Path(output).write_text(json.dumps(result))
    return result
