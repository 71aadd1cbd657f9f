"""The KV cache of a model split across cards: each card keeps the keys and values of its own layers, in a backend
of engine/kv.py on its device; one object in front answers the model's calls by layer, so the model never knows."""

from __future__ import annotations

import torch

from strata.engine.kv import KVBackend, Selection, new_kv_cache
from strata.engine.placement_split import LayerSplit


class SplitKV(KVBackend):
    """The slots in order, backend after backend (each holding its own as slots 0..); a slot is a layer, or a hybrid
    model's attention layer."""

    def __init__(self, backends: list[KVBackend], stages: list[int] | None = None):
        self.backends = backends
        self.stages = stages if stages is not None else list(range(len(backends)))  # the card of each backend
        self.owner: list[tuple[KVBackend, int]] = []  # slot -> (its backend, its index there)
        for backend in backends:
            self.owner += [(backend, local) for local in range(backend.n_layers)]
        self.n_layers = len(self.owner)
        self.n_kv_heads, self.head_dim = backends[0].n_kv_heads, backends[0].head_dim
        self.can_truncate = all(b.can_truncate for b in backends)

    def _at(self, slot: int) -> tuple[KVBackend, int]:
        return self.owner[slot]

    @property
    def max_tokens(self) -> int:
        return self.backends[0].max_tokens

    @property
    def n_bytes(self) -> int:
        return sum(b.n_bytes for b in self.backends)

    def reserve(self, n_tokens: int) -> None:
        for backend in self.backends:
            backend.reserve(n_tokens)

    def truncate(self, length: int) -> None:
        for backend in self.backends:
            backend.truncate(length)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
               selection: Selection | None = None) -> torch.Tensor:
        backend, local = self._at(layer)
        if selection is None:
            return backend.attend(local, q, k, v, start)
        return backend.attend(local, q, k, v, start, selection=selection)

    def attend_normed(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
                      norm) -> torch.Tensor:
        backend, local = self._at(layer)
        return backend.attend_normed(local, q, k, v, start, norm)

    def read_keys(self, layer: int, begin: int, end: int) -> torch.Tensor:
        backend, local = self._at(layer)
        return backend.read_keys(local, begin, end)

    # The dense backend's direct access, for tests and tools.
    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        backend, local = self._at(layer)
        backend.write(local, start, k, v)

    def read(self, layer: int, end: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        backend, local = self._at(layer)
        return backend.read(local, end, dtype)


def split_kv(kind, slot_layers: list[int], split: LayerSplit, n_kv_heads: int, head_dim: int,
             max_tokens: int) -> SplitKV:
    """One backend per card that holds any of the slots (slot_layers[slot] is the slot's layer, ascending)."""
    backends, stages = [], []
    for stage in range(split.n_stages):
        count = sum(split.stage_of(layer) == stage for layer in slot_layers)
        if count:
            backends.append(new_kv_cache(kind, count, n_kv_heads, head_dim, max_tokens, split.devices[stage]))
            stages.append(stage)
    return SplitKV(backends, stages)
