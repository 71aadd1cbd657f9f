"""Offloaded prompt reading: every routed expert of a prompt chunk runs on the device, the ones the cache lacks
streamed over PCIe from pinned host memory into a ring of slots lent by the expert cache.

Policy: while layer L's experts compute, the experts of the next layer that the cache lacks and that the previous
chunk routed to at that layer are copied on the side stream, before that layer's router has run (waiting for it would
leave the link idle during layer L). With balanced routing a chunk of T tokens leaves an expert unrouted with
probability (1 - k/E)^T, 1e-3 for T = 100 on Qwen3-30B's 8 of 128: the previous chunk's set is then the whole layer,
which is what this chunk needs; with skewed routing (synthetic models route most tokens to a few experts) it is the
few experts that will be asked for again. A layer with no previous chunk gets all its missing experts when a chunk
that size is 90% likely to route to each, else none. Either way, once the router has run, any missing expert not yet
in the ring is copied then ("late"), so results never depend on the guess: streamed runs give the bytes of
all-resident ones.

The first layer of a chunk is fetched ahead too: for chunk c+1 right after the last layer of chunk c has launched its
experts (the engine says the next chunk's size through `begin_chunk`), and for a prompt's first chunk when the engine
begins it, before the embedding and the first mixer run, by the same policy (the first layer's routing in the last
chunk the streamer saw, which is an earlier prompt's; without one, every missing expert when the chunk is large).

When the copy of the next layer is queued: where the ring holds two layers (STRATA_PF_EARLY, on by default), when
the host reaches layer L, before it reads L's routing; the copy waits on the device only for the slots layer L-1
used. Layer L's late misses then go on a second copy stream (`late_queue`): on the one in-order stream they would
wait behind that whole next-layer batch, and L's experts with them. With STRATA_PF_EARLY=0 (or a one-layer ring)
once L's experts are launched, after the host has read L's routing: the copy of L+1 then waits for the host, which
waits for the device to reach L's router (the link idled ~6.5 ms of every ~19 ms layer in session 9's timeline).
H200, 12 full-size qwen4exp layers at 7 GiB, balanced routing (session 10, gather on 66 programs, median of 3):
early 4K 1.75x the PCIe floor, 32K 1.49x; after the launch 1.76x and 1.54x (16K in another call: 1.51x, 1.73x).

The ring holds two layers' experts where the cache can lend that much (the next layer's copy overlaps this layer's
work), one layer at least; a smaller cache keeps the CPU-pool path. With `work_slots` set (engine/prefill.py's chunk
rule), the chunk's expert work buffers live in a run of that many adjacent borrowed slots (`WorkArena`) instead of
PyTorch's allocator. Lent slots go back to the cache (refilled with their former experts) when the engine's prompt
ends (`return_slots`), or at the first step that is not a prompt chunk.

Host cost (issue 6): a layer reads its routing once (counts into a zeroed row, the layer's one sync), looks its
experts up and places the misses in the ring on numpy arrays, and queues a batch with a few calls (`CopyQueue.gather`);
no Python or torch op per expert, so a layer costs the host about the same for 3 missing experts or 500. By default
(STRATA_PF_STREAM=dma) the batch goes through the copy engines as runs of experts consecutive in the host stacks and
in the slots (engine/copy_runs.py): the ring is then lent an adjacent run of slots where the cache has one, and the
copies take no SM from the layer computing beside them. STRATA_PF_STREAM=gather streams it in one kernel launch that
reads the pinned host stacks itself (kernels/moe/expert_gather.py, on half the SMs). `stats` keeps the host time per
layer for the profiles.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from strata import switches
from strata.engine.copy_queue import CopyQueue, copy_stream_priority
from strata.engine.experts import ExpertStack, accumulate, kernel_path, routed_tokens
from strata.engine.idle_work import IdleWork
from strata.engine.slot_ring import SlotRing
from strata.engine.staging import upload
from strata.errors import StrataError
from strata.kernels.work_arena import WorkArena

PREFETCH_COVERAGE = 0.9  # fetch the next layer ahead when a chunk is this likely to route to each expert
WORK_SHARE = 0.5  # at most this share of the slots the ring leaves may hold a chunk's work buffers


def expected_coverage(n_tokens: int, top_k: int, n_experts: int) -> float:
    """The chance that a chunk of n_tokens routes at least one token to a given expert (independent routing)."""
    return 1.0 - (1.0 - min(top_k, n_experts) / n_experts) ** n_tokens


def ring_size(n_slots: int, experts_per_layer: int) -> int:
    """Slots to lend the ring: two layers' experts while that leaves half the cache, else one layer's, else none."""
    if n_slots < experts_per_layer:
        return 0
    return min(2 * experts_per_layer, max(experts_per_layer, n_slots // 2))


@dataclass
class StreamStats:
    chunks: int = 0
    tokens: int = 0
    bytes_streamed: int = 0  # expert bytes copied into the ring
    bytes_late: int = 0  # of those, copied after the layer's router (not ahead)
    streamed_unused: int = 0  # experts copied ahead that no token of the chunk routed to
    layers: int = 0  # routed layers run
    host_s: float = 0.0  # host time of the streaming itself (bookkeeping, copy launches; not the experts' launches)
    sync_s: float = 0.0  # host time waiting for each layer's routing (the layer's one device read)
    lend_s: float = 0.0  # host time lending the ring (and work slots) at a prompt's start
    refill_s: float = 0.0  # host time giving them back, refilled, at its end
    refill_bytes: int = 0  # expert bytes copied back into lent slots


class PromptStreamer:
    """Runs a prompt chunk's routed experts on the device for `CachedExperts`: cached slots plus ring slots."""

    def __init__(self, host_stacks: dict[int, ExpertStack], cache, device: torch.device, min_tokens: int,
                 queue: CopyQueue | None = None):
        self.host_stacks, self.cache, self.min_tokens = host_stacks, cache, min_tokens
        self.device = torch.device(device)
        self.queue = queue or CopyQueue(self.device, cache.copy_stream)  # the cache's stream: admits stay ordered
        layers = sorted(host_stacks)
        self.next_layer = dict(zip(layers, layers[1:]))
        self.experts_per_layer = max((s.n_experts for s in host_stacks.values()), default=0)
        self.ring_slots = ring_size(cache.n_slots, self.experts_per_layer)
        # STRATA_PF_EARLY: the next layer's copy queued before this layer's routing read, where the ring holds two
        # layers (this layer's late experts then still find room: it holds at most one layer's, the next one another).
        two_layers = self.experts_per_layer > 0 and self.ring_slots >= 2 * self.experts_per_layer
        self.early = switches.get("STRATA_PF_EARLY") and two_layers
        self.late_queue = self.queue  # where late misses are copied: their own stream when copies are queued early
        if self.early:
            late_stream = (torch.cuda.Stream(self.device, priority=copy_stream_priority())
                           if self.device.type == "cuda" else None)
            self.late_queue = CopyQueue(self.device, late_stream)
        self.ring: SlotRing | None = None
        self.work_slots = 0  # adjacent slots to borrow for the chunk's work buffers (set by the engine's chunk rule)
        self.arena: WorkArena | None = None
        self.next_chunk_tokens = 0  # the size of the prompt chunk after this one (0: none follows)
        self.stats = StreamStats()
        self._over_slots = {}
        self.last_routed: dict[int, np.ndarray] = {}  # layer -> experts the last chunk routed to there (sorted)
        self.idle: IdleWork | None = None  # the engine's host work for the routing waits (engine/idle_work.py)
        self._counts_host: torch.Tensor | None = None  # pinned: the routing's counts, read after an event

    def takes(self, x: torch.Tensor) -> bool:
        return self.takes_tokens(x.shape[0])

    def takes_tokens(self, n_tokens: int) -> bool:
        return n_tokens >= self.min_tokens and self.ring_slots > 0

    def lendable_work_slots(self) -> int:
        """The most slots the chunk rule may borrow for work buffers, beside the ring."""
        return int((self.cache.n_slots - self.ring_slots) * WORK_SHARE) if self.ring_slots else 0

    def _ensure_ring(self) -> SlotRing:
        if self.ring is None:
            started = time.perf_counter()
            released = self.queue.mark()  # queued decode work may still read the lent slots' experts
            if self.work_slots:  # first: a run of adjacent slots is harder to find than any slots
                run = self.cache.borrow_run(self.work_slots)
                self.arena = WorkArena(self.cache.slots[run[0] : run[-1] + 1].view(-1))
                self.queue.drain()  # an admit into the run still in flight lands before kernels write buffers there
            lent = self._borrow_ring()
            self.ring = SlotRing(self.cache.slots, lent, self.queue, released)
            self.stats.lend_s += time.perf_counter() - started
        return self.ring

    def _borrow_ring(self) -> list[int]:
        """The ring's slots: the least-routed ones; for the copy engines, whose copies are runs of consecutive slot
        rows, an adjacent run where the cache has one (else the least-routed ones in ascending order)."""
        if not self.queue.dma:
            return self.cache.borrow(self.ring_slots)
        try:
            return self.cache.borrow_run(self.ring_slots)
        except StrataError:
            return sorted(self.cache.borrow(self.ring_slots))

    def return_slots(self) -> None:
        """Give the lent slots back to the cache, refilled with the experts they held before."""
        if self.ring is not None:
            started, moved = time.perf_counter(), self.cache.stats.bytes_moved
            self.ring, self.arena = None, None
            self.cache.refill()  # admits wait for the compute stream: the last chunk is done with its buffers
            self.stats.refill_s += time.perf_counter() - started
            self.stats.refill_bytes += self.cache.stats.bytes_moved - moved

    def begin_chunk(self, n_tokens: int, next_tokens: int, top_k: int) -> None:
        """The engine starts a prompt chunk of n_tokens (next_tokens follow it, 0 for none; top_k experts a token):
        lend the ring and fetch the first layer's experts ahead, unless the previous chunk's last layer did so."""
        self.next_chunk_tokens = next_tokens
        if not self.takes_tokens(n_tokens) or not self.host_stacks:
            return
        started = time.perf_counter()
        self._ensure_ring()
        self._prefetch(min(self.host_stacks), n_tokens, top_k)
        self.stats.host_s += time.perf_counter() - started

    @property
    def copy_calls(self) -> int:
        """Copy calls the dma forms have queued (both queues)."""
        return self.queue.copies + (self.late_queue.copies if self.late_queue is not self.queue else 0)

    def _prefetch(self, layer: int, n_tokens: int, top_k: int) -> None:
        """Copy ahead the experts of `layer` the policy predicts and the cache lacks, likeliest first (routing
        counts) in case the ring runs short: one launch, numpy bookkeeping."""
        stack = self.host_stacks[layer]
        predicted = self.last_routed.get(layer)
        if predicted is None:
            if expected_coverage(n_tokens, top_k, stack.n_experts) < PREFETCH_COVERAGE:
                return
            predicted = np.arange(stack.n_experts)
        predicted = np.asarray(predicted, dtype=np.int64)
        missing = predicted[self.cache.layer_slots(layer)[predicted] < 0]
        counts = self.cache.counts[layer].numpy()
        ranked = missing[np.lexsort((missing, -counts[missing]))]
        _, copied = self.ring.hold_many(layer, stack, ranked)
        self.stats.bytes_streamed += copied * stack.expert_bytes

    def _routed(self, ids: torch.Tensor, n_experts: int) -> np.ndarray:
        """The experts the chunk routes to, sorted (like routed_tokens): one device read, the layer's one sync.
        Counted into a zeroed row, not by `bincount`, whose output size needs the ids' maximum read first (on the
        H200's timeline: a second device read each layer, on the path from the router to the next copy). With host
        work waiting (`idle`), the counts come through a pinned row behind an event, the work done meanwhile."""
        flat = ids.reshape(-1).long()
        counts = torch.zeros(n_experts, dtype=torch.int32, device=ids.device)
        counts.index_add_(0, flat, torch.ones(flat.shape, dtype=torch.int32, device=ids.device))
        if self.idle is None or not self.idle.pieces or not counts.is_cuda:
            return np.flatnonzero(counts.cpu().numpy())
        if self._counts_host is None or self._counts_host.numel() != n_experts:
            self._counts_host = torch.empty(n_experts, dtype=torch.int32, pin_memory=True)
        self._counts_host.copy_(counts, non_blocking=True)
        landed = torch.cuda.Event()
        landed.record(torch.cuda.current_stream(self.device))
        self.idle.wait(landed)
        return np.flatnonzero(self._counts_host.numpy())

    def _prefetch_next(self, layer: int, n_tokens: int, top_k: int) -> None:
        """Copy ahead the layer after `layer`: in this chunk, or the next chunk's first one after its last."""
        if layer in self.next_layer:
            self._prefetch(self.next_layer[layer], n_tokens, top_k)
        elif self.takes_tokens(self.next_chunk_tokens):  # the next chunk's first layer, during this one's tail
            self._prefetch(min(self.host_stacks), self.next_chunk_tokens, top_k)

    def run(self, layer: int, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        started = time.perf_counter()
        ring = self._ensure_ring()
        stack = self.host_stacks[layer]
        if self.early:  # the next layer's copy, queued before this layer's routing read (module docstring)
            self._prefetch_next(layer, x.shape[0], ids.shape[1])
        asked = time.perf_counter()
        routed = self.last_routed[layer] = self._routed(ids, stack.n_experts)
        read = time.perf_counter()
        slots = self.cache.lookup_slots(layer, routed)
        misses = np.flatnonzero(slots < 0)
        held, copied = ring.hold_many(layer, stack, routed[misses], queue=self.late_queue)
        if (held < 0).any():
            raise StrataError(f"layer {layer}: the streaming ring of {len(ring)} slots cannot hold its "
                              f"{len(misses)} missing experts")
        slots[misses] = held
        self.stats.bytes_streamed += copied * stack.expert_bytes
        self.stats.bytes_late += copied * stack.expert_bytes
        self.stats.streamed_unused += len(ring.held_for(layer)) - len(misses)  # held slots include every miss's
        ring.wait_landed(layer)
        computing = time.perf_counter()
        out = self._compute(layer, stack, x, weights, ids, routed, slots)
        computed = time.perf_counter()
        if not self.early:
            self._prefetch_next(layer, x.shape[0], ids.shape[1])
        if layer not in self.next_layer:
            self.stats.chunks += 1
            self.stats.tokens += x.shape[0]
            self.next_chunk_tokens = 0  # said once per chunk: a chunk the engine did not announce fetches nothing
        ring.release(layer)
        self.stats.layers += 1
        self.stats.sync_s += read - asked
        self.stats.host_s += (asked - started) + (computing - read) + (time.perf_counter() - computed)
        return out

    def _compute(self, layer, stack, x, weights, ids, experts: np.ndarray, slots: np.ndarray) -> torch.Tensor:
        """The same kernels (or reference loop) as `ResidentExperts`, reading expert experts[i] from slot slots[i]."""
        if kernel_path(stack, x) == "prompt":
            from strata.kernels.moe import PromptExperts, moe_prefill

            if layer not in self._over_slots:
                self._over_slots[layer] = PromptExperts.over_slots(self.cache.slots, stack)
            table = np.full(stack.n_experts, -1, dtype=np.int32)
            table[experts] = slots
            return moe_prefill(x, ids.to(torch.int32), weights.float(), self._over_slots[layer],
                               slot_of=upload(torch.from_numpy(table), x.device), scratch=self.arena)
        routes = routed_tokens(ids)
        slot_of = dict(zip(experts.tolist(), slots.tolist()))
        out = torch.zeros_like(x)
        accumulate(out, routes, weights, x, lambda e: self.cache.expert_weights(layer, slot_of[e]), routes)
        return out
