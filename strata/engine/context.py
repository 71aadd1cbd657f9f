"""The per-step forward context: what the engine tells the model about the tokens it is computing."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from strata.engine.kv import KVBackend, attend_as_steps


@dataclass
class ForwardContext:
    kv: KVBackend  # or a HybridCache, which holds one for its attention layers
    start: int  # position of the first token of this step
    n_tokens: int
    want_all_logits: bool = False  # the prompt path's logits for every token, not only the last
    want_hidden: bool = False  # keep the final normed hidden states of every token in `hidden` (MTP drafts read them)
    keep_row_states: bool = False  # a verify window: recurrent layers keep each row's state, to roll back rejected rows
    hidden: torch.Tensor | None = None  # set by the model when want_hidden: [n_tokens, embd]
    tokens: list[int] | None = None  # the ids on the host, where the caller has them: spares the model a device read

    def positions(self, device: torch.device) -> torch.Tensor:
        return torch.arange(self.start, self.start + self.n_tokens, device=device)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               selection: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """`kv.attend` of this step; a verify window's rows one at a time (`attend_as_steps`)."""
        if self.keep_row_states:
            return attend_as_steps(self.kv, layer, q, k, v, self.start, selection)
        return self.kv.attend(layer, q, k, v, self.start, *(() if selection is None else (selection,)))

    def attend_projected(self, layer: int, x: torch.Tensor, qkv, heads, norm, config) -> torch.Tensor | None:
        """The captured step's chained q/k/v projection (STRATA_DECODE_CHAIN, engine/decode.py's StaticContext);
        None here: the caller projects and calls `attend_normed`."""
        return None

    def attend_normed(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, norm) -> torch.Tensor:
        """`attend` after the q/k norm + RoPE of `norm` (models.layers.QKNorm): the backend's `attend_normed` (one
        launch for both where it stores the turned keys itself), or a verify window's rows one at a time."""
        if self.keep_row_states:
            return self.attend(layer, *norm.apply(q, k), v)
        return self.kv.attend_normed(layer, q, k, v, self.start, norm)
