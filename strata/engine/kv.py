"""KV storage for one sequence: per layer, keys and values of every cached position in a chosen dtype."""

from __future__ import annotations

import torch

from strata.errors import StrataError


class KVCache:
    """Dense fp16/bf16/fp32 cache that grows by doubling up to `max_tokens` (the context size)."""

    can_truncate = True  # positions can be forgotten from the end (a recurrent state could not)

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, max_tokens: int,
                 dtype: torch.dtype, device: torch.device, initial_tokens: int = 256):
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        self.max_tokens, self.dtype, self.device = max_tokens, dtype, device
        self.capacity = min(initial_tokens, max_tokens)
        shape = (self.capacity, n_kv_heads, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]

    @property
    def n_bytes(self) -> int:
        return 2 * self.n_layers * self.capacity * self.n_kv_heads * self.head_dim * self.keys[0].element_size()

    def reserve(self, n_tokens: int) -> None:
        if n_tokens > self.max_tokens:
            raise StrataError(f"{n_tokens} tokens exceed the context size of {self.max_tokens} (raise n_ctx)")
        if n_tokens <= self.capacity:
            return
        new_capacity = min(max(n_tokens, 2 * self.capacity), self.max_tokens)
        for store in (self.keys, self.values):
            for i, old in enumerate(store):
                grown = torch.zeros((new_capacity, *old.shape[1:]), dtype=self.dtype, device=self.device)
                grown[: self.capacity] = old
                store[i] = grown
        self.capacity = new_capacity

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self.keys[layer][start : start + k.shape[0]] = k.to(self.dtype)
        self.values[layer][start : start + v.shape[0]] = v.to(self.dtype)

    def read(self, layer: int, end: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys[layer][:end].to(dtype), self.values[layer][:end].to(dtype)

    def truncate(self, length: int) -> None:
        """Forget positions from `length` on. Here nothing needs doing: later writes overwrite them, and reads
        stop at the step's start. Caches holding recurrent state reset it instead (can_truncate = False)."""
