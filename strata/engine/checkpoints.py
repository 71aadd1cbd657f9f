"""Checkpoints of recent conversations: copies of a sequence's cache (KV cells, GatedDeltaNet conv and recurrent
states) so that a follow-up whose prompt extends one is read from its new tokens on, even after other conversations
have used the engine in between.

The engine keeps one live sequence. When a prompt leaves it (another conversation, or a scoring request), the live
state is copied here first; when a prompt extends a checkpoint further than it extends the live sequence, the
checkpoint is copied back. A hybrid model's cache cannot be rewound, so it is also checkpointed at the end of each
prompt: the next turn of a chat usually re-renders the reply (without its thinking, say) and extends the prompt, not
the live state. Copies live in host RAM (pinned) when the cache is on the GPU. The store keeps at most `max_count`
checkpoints and `max_bytes` of them, dropping the least recently used first.

A restored cache holds bit for bit what the saved one held: reading a prompt after a restore computes what reading
it after the live prefix would.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import torch

from strata.engine.hybrid_cache import HybridCache
from strata.engine.kv import KVCache
from strata.engine.kv_paged import PagedInt8KV
from strata.engine.qwen4exp_cache import Qwen4ExpCache
from strata.engine.split_cache import SplitKV
from strata.engine.staging import upload
from strata.kernels.attention.paged import PAGE


@dataclass
class Checkpoint:
    tokens: tuple[int, ...]
    state: Any  # what the cache's snapshot function returned
    n_bytes: int


@dataclass
class CheckpointStats:
    saved: int = 0
    restored: int = 0
    restored_tokens: int = 0  # prompt tokens not read again thanks to a restore
    evicted: int = 0
    save_s: float = 0.0  # host time of the saves (allocating host memory, queueing the copies)
    saved_bytes: int = 0
    reserved_s: float = 0.0  # host time pinning slabs ahead of the saves (reserve_pieces; in the prompt's waits)
    reserved_bytes: int = 0


@dataclass(frozen=True)
class Reuse:
    """How the next prompt starts: `tokens` leading tokens taken from the live cache, or from `checkpoint`."""

    tokens: int
    checkpoint: Checkpoint | None = None


def common_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def usable_prefix(held: list[int] | tuple[int, ...], ids: list[int], can_truncate: bool) -> int:
    """Leading tokens of `ids` that a cache holding `held` can start from. At least the last token of `ids` is read
    again (its logits are the answer); a cache that cannot be rewound serves only when it holds a prefix whole."""
    shared = common_prefix(held, ids[:-1])
    if shared < len(held) and not can_truncate:
        return 0
    return shared


# ---- snapshots of each cache kind: (copy of the first n tokens' state, bytes) and the way back ----


class HostCopies:
    """Where one snapshot's tensors are copied: views into a few large host slabs (pinned when the cache is on a GPU)
    instead of an allocation each. A qwen4exp snapshot is ~150 tensors; each fresh pinned allocation maps and locks
    its pages (rounded up to a power of two) while the prompt's end waits on the host. Slabs double from 4 MiB to
    64 MiB (a larger tensor gets its own), so the unused tail stays under the last slab; a slab goes back to torch's
    pinned cache (reused by the next snapshot) when the last checkpoint view of it is dropped. `reserve`: slabs
    allocated ahead (CheckpointStore.reserve_pieces), taken first where a tensor fits one; the list is consumed."""

    FIRST, LARGEST, ALIGN = 4 << 20, 64 << 20, 256

    def __init__(self, reserve: list[torch.Tensor] | None = None):
        self.slab: torch.Tensor | None = None
        self.used = 0
        self.next_size = self.FIRST
        self.reserve = reserve if reserve is not None else []

    def _take(self, n_bytes: int, pinned: bool) -> torch.Tensor:
        room = self.slab is not None and self.used + n_bytes <= self.slab.numel() and self.slab.is_pinned() == pinned
        if not room and self.reserve and self.reserve[-1].is_pinned() == pinned:
            if n_bytes > self.reserve[-1].numel():  # larger than a reserved slab: its own (as `slabs_for` counts)
                return torch.empty(n_bytes, dtype=torch.uint8, pin_memory=pinned)
            self.slab, self.used, room = self.reserve.pop(), 0, True
        if not room:
            if n_bytes > self.next_size:  # a slab of its own; the current one keeps taking the smaller tensors
                return torch.empty(n_bytes, dtype=torch.uint8, pin_memory=pinned)
            self.slab = torch.empty(self.next_size, dtype=torch.uint8, pin_memory=pinned)
            self.used, self.next_size = 0, min(2 * self.next_size, self.LARGEST)
        part = self.slab[self.used : self.used + n_bytes]
        self.used += aligned(n_bytes)  # the next view starts aligned for any dtype
        return part

    def copy(self, t: torch.Tensor) -> torch.Tensor:
        host = self._take(t.numel() * t.element_size(), pinned=t.device.type == "cuda").view(t.dtype).view(t.shape)
        # Queued, no host wait: only a restore reads the copy, through the same stream, after it. (A blocking copy
        # made the host wait for the whole prompt at the first tensor, then allocate and copy the rest one by one.)
        host.copy_(t, non_blocking=t.device.type == "cuda")
        return host


def aligned(n_bytes: int) -> int:
    return -(-n_bytes // HostCopies.ALIGN) * HostCopies.ALIGN


def slabs_for(sizes: list[int], slab_bytes: int) -> int:
    """How many slabs of slab_bytes HostCopies fills with tensors of these sizes, in this order (one larger than a
    slab gets its own allocation, outside them)."""
    count, used = 0, slab_bytes
    for n in sizes:
        if n > slab_bytes:
            continue
        if used + n > slab_bytes:
            count, used = count + 1, 0
        used += aligned(n)
    return count


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _refresh_selector(cache, n: int) -> None:
    """A Quest selector (`--qsa quest`) keeps block bounds of the keys it saw: recompute them from the restored ones."""
    if getattr(cache, "selector", None) is None or not n:
        return
    for layer in range(cache.n_layers):
        cache.selector.observe(layer, 0, n, lambda a, b, layer=layer: cache.read_keys(layer, a, b))


def _snapshot_dense(cache: KVCache, n: int, host: HostCopies):
    keys = [host.copy(k[:n]) for k in cache.keys]
    values = [host.copy(v[:n]) for v in cache.values]
    return (n, keys, values), _nbytes(keys) + _nbytes(values)


def _sizes_dense(cache: KVCache, n: int) -> list[int]:
    """(The buffers grow: n rows of each, whatever they hold now.)"""
    return [n * (t.numel() // t.shape[0]) * t.element_size() for t in (*cache.keys, *cache.values)]


def _restore_dense(cache: KVCache, state) -> None:
    n, keys, values = state
    cache.reserve(n)
    for layer in range(cache.n_layers):
        cache.keys[layer][:n].copy_(keys[layer])
        cache.values[layer][:n].copy_(values[layer])
    _refresh_selector(cache, n)


def _page_rows(cache: PagedInt8KV, pages: list[int]) -> torch.Tensor:
    """Pool rows of these physical pages, page after page (a page's rows are contiguous)."""
    per_page = cache.n_kv_heads * PAGE
    base = upload(torch.tensor(pages, dtype=torch.long), cache.device)[:, None] * per_page  # pinned: no host wait
    return (base + torch.arange(per_page, device=cache.device)).reshape(-1)


def _snapshot_paged(cache: PagedInt8KV, n: int, host: HostCopies):
    rows = _page_rows(cache, cache.pages[: math.ceil(n / PAGE)])
    pools = [tuple(host.copy(t[rows]) for t in (p.k, p.v, p.k_scale, p.v_scale)) for p in cache.pools]
    return (n, pools), sum(_nbytes(parts) for parts in pools)


def _sizes_paged(cache: PagedInt8KV, n: int) -> list[int]:
    rows = math.ceil(n / PAGE) * cache.n_kv_heads * PAGE
    return [rows * (t.numel() // t.shape[0]) * t.element_size()
            for p in cache.pools for t in (p.k, p.v, p.k_scale, p.v_scale)]


def _restore_paged(cache: PagedInt8KV, state) -> None:
    n, pools = state
    cache.truncate(0)
    cache.reserve(n)
    rows = _page_rows(cache, cache.pages)
    for pool, saved in zip(cache.pools, pools):
        for target, values in zip((pool.k, pool.v, pool.k_scale, pool.v_scale), saved):
            target[rows] = values.to(target.device)
    _refresh_selector(cache, n)


def _snapshot_hybrid(cache: HybridCache, n: int, host: HostCopies):
    kv, kv_bytes = snapshot(cache.kv, n, host)
    conv = {i: host.copy(t) for i, t in cache.conv.items()}
    state = {i: host.copy(t) for i, t in cache.state.items()}
    return (n, kv, conv, state), kv_bytes + _nbytes(conv.values()) + _nbytes(state.values())


def _sizes_hybrid(cache: HybridCache, n: int) -> list[int]:
    return snapshot_sizes(cache.kv, n) + [_nbytes([t]) for t in (*cache.conv.values(), *cache.state.values())]


def _restore_hybrid(cache: HybridCache, saved) -> None:
    n, kv, conv, state = saved
    restore(cache.kv, kv)
    for i, t in conv.items():
        cache.conv[i].copy_(t)
    for i, t in state.items():
        cache.state[i].copy_(t)
    cache.length = n


def _snapshot_qwen4exp(cache: Qwen4ExpCache, n: int, host: HostCopies):
    hybrid, n_bytes = _snapshot_hybrid(cache, n, host)
    extra = {name: host.copy(t) for name, t in cache.saved_state(n).items()}
    mtp, mtp_bytes = snapshot(cache.mtp_kv, n, host) if cache.mtp_kv is not None else (None, 0)
    return (hybrid, extra, mtp), n_bytes + _nbytes(extra.values()) + mtp_bytes


def _sizes_qwen4exp(cache: Qwen4ExpCache, n: int) -> list[int]:
    mtp = snapshot_sizes(cache.mtp_kv, n) if cache.mtp_kv is not None else []
    return _sizes_hybrid(cache, n) + cache.saved_state_sizes(n) + mtp


def _restore_qwen4exp(cache: Qwen4ExpCache, saved) -> None:
    hybrid, extra, mtp = saved
    _restore_hybrid(cache, hybrid)
    cache.load_state(extra)
    if mtp is not None:
        restore(cache.mtp_kv, mtp)


def _snapshot_split(cache: SplitKV, n: int, host: HostCopies):
    """A layer split: each card's backend copied as its kind is."""
    parts = [snapshot(backend, n, host) for backend in cache.backends]
    return [state for state, _ in parts], sum(n_bytes for _, n_bytes in parts)


def _sizes_split(cache: SplitKV, n: int) -> list[int]:
    return [size for backend in cache.backends for size in snapshot_sizes(backend, n)]


def _restore_split(cache: SplitKV, states) -> None:
    for backend, state in zip(cache.backends, states):
        restore(backend, state)


_KINDS: dict[type, tuple[Callable, Callable, Callable]] = {  # snapshot, restore, the snapshot's tensor sizes
    KVCache: (_snapshot_dense, _restore_dense, _sizes_dense),
    PagedInt8KV: (_snapshot_paged, _restore_paged, _sizes_paged),
    HybridCache: (_snapshot_hybrid, _restore_hybrid, _sizes_hybrid),
    Qwen4ExpCache: (_snapshot_qwen4exp, _restore_qwen4exp, _sizes_qwen4exp),
    SplitKV: (_snapshot_split, _restore_split, _sizes_split),
}


def supports(cache) -> bool:
    """A cache of a kind this file can copy (a hybrid one also needs its KV part, a split each card's, to be one)."""
    if type(cache) not in _KINDS:  # exact types: a subclass may hold state its base class's copy would miss
        return False
    if isinstance(cache, SplitKV):
        return all(supports(backend) for backend in cache.backends)
    return supports(cache.kv) if isinstance(cache, HybridCache) else True


def snapshot(cache, n: int, host: HostCopies | None = None):
    """(a copy of the first n tokens' state of `cache`, its bytes), copied into `host`'s slabs (new ones if None)."""
    return _KINDS[type(cache)][0](cache, n, host or HostCopies())


def restore(cache, state) -> None:
    _KINDS[type(cache)][1](cache, state)


def snapshot_sizes(cache, n: int) -> list[int]:
    """The bytes of each tensor a snapshot of the first n tokens copies, in the order `snapshot` copies them."""
    return _KINDS[type(cache)][2](cache, n)


# ---- the store ----


RESERVE_SLAB_MIN, RESERVE_SLAB_MAX = 8 << 20, 64 << 20  # slabs pinned ahead: large enough for most tensors


class CheckpointStore:
    def __init__(self, max_count: int, max_bytes: int):
        self.max_count, self.max_bytes = max_count, max_bytes
        self.items: OrderedDict[tuple[int, ...], Checkpoint] = OrderedDict()  # least recently used first
        self.n_bytes = 0  # kept as a number: the server's metrics read it while the engine thread changes items
        self.stats = CheckpointStats()
        self.reserve: list[torch.Tensor] = []  # slabs allocated ahead for the next save, taken by its HostCopies

    def reserve_pieces(self, cache, n_tokens: int, pinned: bool) -> list[Callable[[], None]]:
        """The allocations that a save of `cache` holding n_tokens would make, as pieces of one slab each, to be run
        before it (engine/idle_work.py): as many slabs as its tensors fill beyond those already reserved. A slab's
        size is the power of two that holds the snapshot's largest tensor (8 to 64 MiB); a larger one is allocated
        by the save itself. `pinned`: the cache is on a GPU (its copies go to pinned memory)."""
        if not supports(cache) or not self.max_count:
            return []
        sizes = snapshot_sizes(cache, n_tokens)
        if not sizes or sum(sizes) > self.max_bytes:  # a save the store would not keep
            return []
        slab = min(max(1 << (max(sizes) - 1).bit_length(), RESERVE_SLAB_MIN), RESERVE_SLAB_MAX)
        have = sum(s.numel() for s in self.reserve)
        missing = -(-max(slabs_for(sizes, slab) * slab - have, 0) // slab)
        return [lambda: self._reserve_one(slab, pinned) for _ in range(missing)]

    def _reserve_one(self, n_bytes: int, pinned: bool) -> None:
        started = time.perf_counter()
        self.reserve.append(torch.empty(n_bytes, dtype=torch.uint8, pin_memory=pinned))
        self.stats.reserved_s += time.perf_counter() - started
        self.stats.reserved_bytes += n_bytes

    def __len__(self) -> int:
        return len(self.items)

    def _covered(self, tokens: tuple[int, ...], can_truncate: bool) -> Checkpoint | None:
        """A checkpoint that already serves every prompt `tokens` would: the same tokens, or (when the cache can be
        rewound) a longer sequence starting with them."""
        for checkpoint in self.items.values():
            held = checkpoint.tokens
            if held == tokens or (can_truncate and len(held) > len(tokens) and held[: len(tokens)] == tokens):
                return checkpoint
        return None

    def save(self, tokens: list[int], cache) -> None:
        """Keep a copy of `cache`, which holds `tokens`."""
        key = tuple(tokens)
        if not key or not supports(cache):
            return
        can_truncate = cache.can_truncate
        known = self._covered(key, can_truncate)
        if known is not None:
            self.items.move_to_end(known.tokens)
            return
        started = time.perf_counter()
        state, n_bytes = snapshot(cache, len(key), HostCopies(self.reserve))
        self.stats.save_s += time.perf_counter() - started
        if n_bytes > self.max_bytes:
            return
        self.stats.saved_bytes += n_bytes
        if can_truncate:  # the new one serves every prompt that a prefix of it served
            for held in [h for h in self.items if h == key[: len(h)]]:
                self.n_bytes -= self.items.pop(held).n_bytes
        self.items[key] = Checkpoint(key, state, n_bytes)
        self.n_bytes += n_bytes
        self.stats.saved += 1
        while len(self.items) > self.max_count or self.n_bytes > self.max_bytes:
            self.n_bytes -= self.items.popitem(last=False)[1].n_bytes
            self.stats.evicted += 1

    def best(self, ids: list[int], can_truncate: bool) -> Reuse:
        """The checkpoint from which the most leading tokens of `ids` can be taken."""
        found = Reuse(0)
        for checkpoint in self.items.values():
            n = usable_prefix(checkpoint.tokens, ids, can_truncate)
            if n > found.tokens:
                found = Reuse(n, checkpoint)
        return found

    def restore(self, checkpoint: Checkpoint, cache, reused: int) -> None:
        """Copy `checkpoint` into `cache`. It may have been dropped since it was found (saving the sequence it
        replaces made room): its copy is still whole, and the cache, once left, is saved again."""
        restore(cache, checkpoint.state)
        if checkpoint.tokens in self.items:
            self.items.move_to_end(checkpoint.tokens)
        self.stats.restored += 1
        self.stats.restored_tokens += reused
