"""The cache of a hybrid model (GatedDeltaNet + attention) for one sequence.

Attention layers keep keys and values per position (a KV backend of engine/kv.py over those layers only: dense or
int8 paged). GatedDeltaNet layers keep a fixed-size summary instead: the last kernel-1 inputs of their causal conv,
and the recurrent state [value heads, key dim, value dim]. A summary cannot forget its last tokens, so the cache cannot be rewound:
the engine starts such a sequence over (position 0) rather than truncate it. The one exception is a verify window
(engine/spec.py): its step keeps every row's summary, so `keep_rows` can drop the rejected rows exactly.
"""

from __future__ import annotations

import torch

from strata.engine.kv import Selection, new_kv_cache
from strata.errors import StrataError


class HybridCache:
    can_truncate = False

    def __init__(self, recurrent_layers: tuple[bool, ...], n_kv_heads: int, head_dim: int,
                 conv_shape: tuple[int, int], state_shape: tuple[int, int, int], max_tokens: int,
                 kv_dtype: str | torch.dtype, conv_dtype: torch.dtype, device: torch.device,
                 layer_devices: list[torch.device] | None = None, kv=None):
        """A layer split across cards (engine/split_cache.py) gives each layer's device and the attention layers'
        KV backend (`kv`, over their slots in order)."""
        self.recurrent_layers = tuple(recurrent_layers)
        self.conv_shape, self.state_shape = tuple(conv_shape), tuple(state_shape)
        attention = [i for i, recurrent in enumerate(self.recurrent_layers) if not recurrent]
        self.kv_slot = {layer: slot for slot, layer in enumerate(attention)}
        self.kv = kv or new_kv_cache(kv_dtype, len(attention), n_kv_heads, head_dim, max_tokens, device)
        recurrent = [i for i, r in enumerate(self.recurrent_layers) if r]
        on = layer_devices or [device] * len(self.recurrent_layers)
        self.conv = {i: torch.zeros(self.conv_shape, dtype=conv_dtype, device=on[i]) for i in recurrent}
        # The state accumulates over the whole sequence: float32 whatever the activations are.
        self.state = {i: torch.zeros(self.state_shape, dtype=torch.float32, device=on[i]) for i in recurrent}
        self.length = 0  # tokens the states have seen
        self.window_start = 0  # the last step's first position
        self.window_rows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # layer -> (conv, state) after each row

    @property
    def max_tokens(self) -> int:
        return self.kv.max_tokens

    @property
    def n_bytes(self) -> int:
        fixed = sum(t.numel() * t.element_size() for t in (*self.conv.values(), *self.state.values()))
        return self.kv.n_bytes + fixed

    def check(self, source: str, recurrent_layers: tuple[bool, ...], conv_shape: tuple[int, int],
              state_shape: tuple[int, int, int]) -> None:
        """Raise unless this cache was made for a model of this layer pattern and these state shapes."""
        if self.recurrent_layers != tuple(recurrent_layers):
            raise StrataError(f"{source}: the cache's layer pattern {_pattern(self.recurrent_layers)} is not the "
                              f"model's {_pattern(recurrent_layers)}")
        for what, have, want in (("conv state", self.conv_shape, conv_shape),
                                 ("recurrent state", self.state_shape, state_shape)):
            if have != tuple(want):
                raise StrataError(f"{source}: the cache's {what} has shape {list(have)}, the model needs {list(want)}")

    def begin(self, start: int, n_tokens: int) -> None:
        """Before a forward step over positions start..start+n_tokens: a new sequence at 0, else continue."""
        if start == 0:
            self.reset()
        elif start != self.length:
            raise StrataError(f"a recurrent state holds {self.length} tokens and cannot continue at position {start}")
        self.kv.reserve(start + n_tokens)
        self.length = start + n_tokens
        self.window_start = start
        self.window_rows.clear()

    def keep_row_states(self, layer: int, conv_rows: torch.Tensor, state_rows: torch.Tensor) -> None:
        """A verify window's recurrent layer: the states after each of its rows; the last row's become current."""
        self.conv[layer].copy_(conv_rows[-1])
        self.state[layer].copy_(state_rows[-1])
        self.window_rows[layer] = (conv_rows, state_rows)

    def keep_rows(self, n_rows: int) -> None:
        """After a verify window: keep its first n_rows tokens, as if only they had been decoded."""
        if not 1 <= n_rows <= self.length - self.window_start:
            raise StrataError(f"cannot keep {n_rows} rows of a step of {self.length - self.window_start}")
        recurrent = [i for i, r in enumerate(self.recurrent_layers) if r]
        if n_rows < self.length - self.window_start and set(self.window_rows) != set(recurrent):
            raise StrataError("the last step kept no per-row states (not a verify window): its rows cannot be dropped")
        if self.window_rows and n_rows < self.length - self.window_start:  # all rows kept: the last row's are current
            layers = list(self.window_rows)
            # Every layer's conv and recurrent state in one multi-tensor copy (a launch or two, not two a layer).
            torch._foreach_copy_([t for i in layers for t in (self.conv[i], self.state[i])],
                                 [rows[n_rows - 1] for i in layers for rows in self.window_rows[i]])
        self.window_rows.clear()
        self.length = self.window_start + n_rows
        self.kv.truncate(self.length)

    def reset(self) -> None:
        for t in (*self.conv.values(), *self.state.values()):
            t.zero_()
        self.length = 0

    def truncate(self, length: int) -> None:
        """Keep the first `length` tokens: possible only for all of them (nothing to do) or none (reset)."""
        if length == 0:
            self.reset()
        elif length != self.length:
            raise StrataError(f"a recurrent state cannot be rewound from {self.length} to {length} tokens")

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
               selection: Selection | None = None) -> torch.Tensor:
        if selection is None:  # backends without a selection argument (the static decode views) still fit
            return self.kv.attend(self.kv_slot[layer], q, k, v, start)
        return self.kv.attend(self.kv_slot[layer], q, k, v, start, selection=selection)

    def attend_normed(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
                      norm) -> torch.Tensor:
        return self.kv.attend_normed(self.kv_slot[layer], q, k, v, start, norm)

    # The dense backend's direct access, for tests and tools.
    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self.kv.write(self.kv_slot[layer], start, k, v)

    def read(self, layer: int, end: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return self.kv.read(self.kv_slot[layer], end, dtype)


def _pattern(recurrent_layers: tuple[bool, ...]) -> str:
    """'RRRA...': R for a recurrent layer, A for attention."""
    return "".join("R" if r else "A" for r in recurrent_layers) or "(none)"
