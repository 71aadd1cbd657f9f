"""KV storage for one sequence, by name: per layer, the keys and values of every cached position.

A backend stores this step's keys and values and attends the step's queries over the past and the step
(`attend`), so the model files never know which one runs. `attend` takes an optional `selection = (ids, width)`:
ids int32 [T, W], the cells each query attends, ascending (padding past width is ignored), width int32 [T] the
count used. The selection is the whole mask (no further causal mask); None is dense causal attention.
`new_kv_cache(kind, ...)` makes one by name:

| kind                          | class                        | bytes per value |
|-------------------------------|------------------------------|-----------------|
| float16, bfloat16, float32    | KVCache (dense, this file)   | 2, 2, 4         |
| int8                          | PagedInt8KV (kv_paged.py)    | 1 + 2/64        |
| ResidentKind(N): int8 in host RAM, N cells per layer on the device | ResidentInt8KV (kv_resident.py) | 1 + 2/64 |
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from strata import switches
from strata.errors import StrataError
from strata.kernels.attention.paged import GROUP
from strata.kernels.attention.prompt_dense import ROW_EXACT, dense_kernel_applies, dense_selected_attention
from strata.models.layers import attend

DENSE_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
KV_KINDS = (*DENSE_DTYPES, "int8")
Selection = tuple[torch.Tensor, torch.Tensor]  # (ids int32 [T, W] ascending, width int32 [T])


@dataclass(frozen=True)
class ResidentKind:
    """The int8 paged cache with every page in host RAM and `cells` cells per layer on the device (--kv-resident)."""

    cells: int


def check_selection(selection: Selection, n_tokens: int) -> Selection:
    """The selection if its shapes fit a step of `n_tokens` queries, else a StrataError (no device sync)."""
    ids, width = selection
    if ids.dim() != 2 or ids.shape[0] != n_tokens or tuple(width.shape) != (n_tokens,):
        raise StrataError(f"selection ids {list(ids.shape)} / width {list(width.shape)} do not fit a step of "
                          f"{n_tokens} queries (ids [T, W], width [T])")
    return ids, width


def attend_selected(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ids: torch.Tensor,
                    width: torch.Tensor) -> torch.Tensor:
    """GQA attention of q [T, H, D] over the cells `ids[:, :width]` of k, v [S, Hkv, D]: [T, H, D] (0 where the
    selection is empty). SDPA with the selection as its mask, so a full causal selection gives `attend`'s bytes."""
    n_tokens, n_keys = q.shape[0], k.shape[0]
    used = torch.arange(ids.shape[1], device=q.device)[None] < width.to(q.device)[:, None]
    cells = torch.where(used, ids.to(q.device).long(), n_keys)  # unused slots land in a dropped column
    allowed = torch.zeros(n_tokens, n_keys + 1, dtype=torch.bool, device=q.device)
    allowed = allowed.scatter(1, cells, True)[:, :n_keys]
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                         attn_mask=allowed, enable_gqa=True).transpose(0, 1)
    return torch.where(allowed.any(1)[:, None, None], out, 0.0)


def attend_as_steps(kv, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
                    selection: Selection | None = None) -> torch.Tensor:
    """`kv.attend` of a verify window's rows one at a time, each the one-token step plain decoding takes at its
    position: it reads the window's earlier rows' keys as the cache stored them (fp16, int8), not at full precision
    as a prompt chunk does, and attends with one query's arithmetic (issue 10: rows bit-equal to decode steps)."""
    if q.shape[0] == 1:
        return kv.attend(layer, q, k, v, start, *(() if selection is None else (selection,)))
    rows = []
    for r in range(q.shape[0]):
        one = () if selection is None else ((selection[0][r:r + 1], selection[1][r:r + 1]),)
        rows.append(kv.attend(layer, q[r:r + 1], k[r:r + 1], v[r:r + 1], start + r, *one))
    return torch.cat(rows)


class KVBackend(ABC):
    """Keys and values of one sequence, every attention layer; positions 0..max_tokens-1."""

    can_truncate = True  # positions can be forgotten from the end (a recurrent state could not)
    max_tokens: int
    selector = None  # a QuestSelector (engine/quest.py) when the backend picks the cells itself (`--qsa quest`)

    def read_keys(self, layer: int, begin: int, end: int) -> torch.Tensor:
        """Keys of positions begin..end-1 as stored (dequantized): [end - begin, Hkv, D] float32."""
        raise StrataError(f"{type(self).__name__} cannot read its keys back, which --qsa quest needs")

    def reread_bounds(self, n_tokens: int) -> None:
        """Cells 0..n_tokens-1 were written behind attend's back (a checkpoint restored): the selector's bounds from
        the keys as stored now."""
        if self.selector is not None:
            for layer in range(self.n_layers):
                self.selector.observe(layer, 0, n_tokens, lambda a, b, layer=layer: self.read_keys(layer, a, b))

    def own_selection(self, layer: int, q: torch.Tensor, start: int, selection: Selection | None) -> Selection | None:
        """After this step's keys are stored: the caller's selection, else the selector's (None: dense causal)."""
        if self.selector is None:
            return selection
        self.selector.observe(layer, start, start + q.shape[0], lambda a, b: self.read_keys(layer, a, b))
        return selection if selection is not None else self.selector.select(layer, q, start)

    @property
    @abstractmethod
    def n_bytes(self) -> int: ...

    @abstractmethod
    def reserve(self, n_tokens: int) -> None:
        """Make room for positions 0..n_tokens-1 (a StrataError past max_tokens)."""

    @abstractmethod
    def truncate(self, length: int) -> None:
        """Forget positions from `length` on."""

    @abstractmethod
    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
               selection: Selection | None = None) -> torch.Tensor:
        """Store k, v [T, Hkv, D] at positions start.., then attention of q [T, H, D] over positions
        0..start+T-1, causal or only the `selection` (ids [T, W], width [T]): [T, H, D] in q's dtype."""

    def attend_normed(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
                      norm) -> torch.Tensor:
        """`attend` after the q/k norm + RoPE of `norm` (models.layers.QKNorm); a backend that can store the turned
        keys in the same launch (the static decode views) does both at once."""
        q, k = norm.apply(q, k)
        return self.attend(layer, q, k, v, start)


def kv_bytes_per_value(kind: str) -> float:
    """What one stored K or V value costs (int8: the code and its share of an fp16 scale per 64 values)."""
    if kind == "int8":
        return 1 + 2 / GROUP
    return DENSE_DTYPES[check_kind(kind)].itemsize


def check_kind(kind: str, head_dim: int | None = None) -> str:
    """`kind` if it names a backend (that can store heads of `head_dim` values), else a StrataError."""
    if kind not in KV_KINDS:
        raise StrataError(f"kv_dtype {kind!r} is not one of {', '.join(KV_KINDS)}")
    if kind == "int8" and head_dim is not None and head_dim % GROUP:
        raise StrataError(f"kv_dtype int8 quantizes groups of {GROUP} values: head_dim {head_dim} is not a "
                          f"multiple of {GROUP} (use kv_dtype float16)")
    return kind


def new_kv_cache(kind: str | torch.dtype | ResidentKind, n_layers: int, n_kv_heads: int, head_dim: int,
                 max_tokens: int, device: torch.device) -> KVBackend:
    """The backend named `kind` (a KV_KINDS name, a torch float dtype for the dense cache, or a ResidentKind)."""
    if isinstance(kind, ResidentKind):
        from strata.engine.kv_resident import ResidentInt8KV

        return ResidentInt8KV(n_layers, n_kv_heads, head_dim, max_tokens, device, kind.cells)
    if isinstance(kind, torch.dtype):
        return KVCache(n_layers, n_kv_heads, head_dim, max_tokens, kind, device)
    if check_kind(kind) == "int8":
        from strata.engine.kv_paged import PagedInt8KV

        return PagedInt8KV(n_layers, n_kv_heads, head_dim, max_tokens, device)
    return KVCache(n_layers, n_kv_heads, head_dim, max_tokens, DENSE_DTYPES[kind], device)


class KVCache(KVBackend):
    """Dense fp16/bf16/fp32 cache that grows by doubling up to `max_tokens` (the context size)."""

    kernels: bool | None = None  # a selection's attention: the Triton kernel (True), SDPA (False); None: on CUDA

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
        kv = 2 * self.n_layers * self.capacity * self.n_kv_heads * self.head_dim * self.keys[0].element_size()
        return kv + (self.selector.n_bytes if self.selector is not None else 0)

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

    def read_keys(self, layer: int, begin: int, end: int) -> torch.Tensor:
        return self.keys[layer][begin:end].float()

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
               selection: Selection | None = None) -> torch.Tensor:
        self.write(layer, start, k, v)
        selection = self.own_selection(layer, q, start, selection)
        if selection is not None and self.selected_kernel(q):
            # The selected cells read in place from the cache, this step's keys as stored: bf16 activations are
            # exact in fp16 from 2^-17 to 65,280 in magnitude, within 2^-25 below (decode steps read them so too).
            ids, width = check_selection(selection, q.shape[0])
            config = ROW_EXACT if q.shape[0] == 1 else None  # a decode step: the bytes of a window's row
            return dense_selected_attention(q, self.keys[layer], self.values[layer], ids, width,
                                            config=config).to(q.dtype)
        # Past positions come from the cache; this step's keys and values are used at full precision.
        past_k, past_v = self.read(layer, start, q.dtype)
        keys, values = torch.cat((past_k, k)), torch.cat((past_v, v))
        if selection is None:
            return attend(q, keys, values, start)
        return attend_selected(q, keys, values, *check_selection(selection, q.shape[0]))

    def selected_kernel(self, q: torch.Tensor) -> bool:
        """Whether a selection's attention runs the selected-cells kernel (kernels/attention/prompt_dense.py): an fp16
        cache it can read, kernels on (by default on CUDA), `STRATA_QSA_DENSE_MASK` unset (else SDPA with a mask)."""
        kernels = q.is_cuda if self.kernels is None else self.kernels
        return (kernels and not switches.get("STRATA_QSA_DENSE_MASK")
                and dense_kernel_applies(self.keys[0], q.shape[1]))

    def truncate(self, length: int) -> None:
        """Forget positions from `length` on. Here nothing needs doing: later writes overwrite them, and reads
        stop at the step's start. Caches holding recurrent state reset it instead (can_truncate = False)."""
