"""`--misses direct`: the experts the GPU cache lacks are read by the GPU itself from pinned host RAM over PCIe.

Why: behind a cache, the segment scheme of engine/decode.py stops the GPU at every routed layer so that the host
can look the layer's experts up and hand the misses to the CPU pool: 48 host round trips a token, which cost about
25 ms a token on the H200 host even at a 100 % hit rate (A3B shape, session 4). Here the lookup is a device table
(layer, expert) -> slot (-1: not cached), so a decode step never waits on the host and captures as one graph, like
resident experts: the hits run the GEMV kernels over the cache's slots, the misses the same kernels over the pinned
host stacks (zero-copy: a missed expert's bytes cross PCIe once, at the link's rate, and only the rows it needs).

Table upkeep happens on the compute stream between steps, so a step sees one table throughout:
- an evicted expert's entry turns -1 before the copy stream may overwrite its slot (that copy waits for the
  compute stream, so every step before it still read the old expert, every step after reads the host's bytes);
- an admitted expert's entry is set once its copy has landed (checked every `adapt_every` steps, with the counts).
Routing counts accumulate on the device (one index_add a layer); every `adapt_every` steps the host reads them
(one small copy), counts hits and misses against the table they ran with, decays and adapts as ExpertCache does.
"""

from __future__ import annotations

import dataclasses

import torch

from strata.engine.experts import PROMPT_KERNEL_MIN_TOKENS


class DeviceTable:
    """The cache's (layer, expert) -> slot map on its device, kept by ExpertCache's admit/evict hooks, plus the
    per-expert routing counts a captured step adds to."""

    def __init__(self, cache):
        self.cache = cache
        self.row = {layer: i for i, layer in enumerate(sorted(cache.stacks))}
        n_experts = max((s.n_experts for s in cache.stacks.values()), default=0)
        shape = (len(self.row), n_experts)
        self.host = torch.full(shape, -1, dtype=torch.int32)  # what the device table holds, mirrored
        self.table = self.host.to(cache.device)
        self.routed = torch.zeros(shape, dtype=torch.float32, device=cache.device)
        self.expert_ids = torch.arange(n_experts, dtype=torch.int32, device=cache.device)
        # index_add's source: a step taking this path has < PROMPT_KERNEL_MIN_TOKENS rows of at most n_experts pairs
        self.ones = torch.ones(PROMPT_KERNEL_MIN_TOKENS * n_experts, dtype=torch.float32, device=cache.device)
        self.waiting = {slot: key for key, slot in cache.slot_of.items()}  # admitted, not yet in the table
        self.host_experts: dict = {}  # layer -> its pinned host stack as the decode kernels read it
        self.steps = 0  # steps ended since the last collect
        self.publish()

    def evicted(self, key) -> None:
        """Before the slot of `key` is overwritten (or lent): from now on the step reads it from the host."""
        layer, e = key
        row = self.row[layer]
        if self.host[row, e] >= 0:
            self.host[row, e] = -1
            self.table[row, e] = -1
        self.waiting = {s: k for s, k in self.waiting.items() if k != key}

    def admitted(self, key, slot: int) -> None:
        self.waiting[slot] = key

    def publish(self) -> None:
        """Enter the admitted experts whose copies have landed (one upload)."""
        landed = [(slot, key) for slot, key in self.waiting.items() if self.cache._landed(slot)]
        if not landed:
            return
        rows = torch.tensor([self.row[key[0]] for _, key in landed])
        experts = torch.tensor([key[1] for _, key in landed])
        slots = torch.tensor([slot for slot, _ in landed], dtype=torch.int32)
        self.host[rows, experts] = slots
        self.table.index_put_((rows.to(self.table.device), experts.to(self.table.device)), slots.to(self.table.device))
        for slot, _ in landed:
            del self.waiting[slot]

    def count(self, layer: int, ids: torch.Tensor) -> None:
        """Inside a step: the layer's routing, added to the device counts (capturable: no host work)."""
        flat = ids.reshape(-1)
        self.routed[self.row[layer]].index_add_(0, flat.long(), self.ones[: flat.numel()])

    def collect(self, decay: float) -> None:
        """Host side, every `adapt_every` steps (and when a benchmark reads the counters): the device counts into
        the cache's decayed counts and hit statistics (against the table those steps ran with), then the landed
        admits into the table."""
        routed = self.routed.cpu().double()
        self.routed.zero_()
        cached = self.host >= 0
        stats = self.cache.stats
        stats.hits += int(routed[cached].sum().item())
        stats.misses += int(routed[~cached].sum().item())
        for layer, row in self.row.items():
            counts = self.cache.counts[layer]
            counts *= decay ** self.steps  # the steps since the last collect, as if decayed one by one
            counts += routed[row, : counts.numel()]
        self.steps = 0
        self.publish()


def direct_part(backend, layer: int, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """A routed layer's experts with no host in the loop: the cached ones from the slots, the others from pinned
    host RAM. On the GPU (the decode kernels' path) `direct_gemv`; elsewhere the reference loop over the same
    bytes (the CPU form, byte-identical to resident experts)."""
    from strata.engine.experts import accumulate, kernel_path, routed_tokens

    cache, stack = backend.cache, backend.host_stacks[layer]
    cache.device_table.count(layer, ids)
    if kernel_path(stack, x) == "decode":
        return direct_gemv(cache, stack, layer, x, weights, ids)
    routes = routed_tokens(ids)
    slot_of = cache.device_table.host[cache.device_table.row[layer]]
    out = torch.zeros_like(x)
    accumulate(out, routes, weights, x,
               lambda e: cache.expert_weights(layer, int(slot_of[e])) if slot_of[e] >= 0 else stack.expert(e), routes)
    return out


def direct_gemv(cache, stack, layer: int, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Two GEMV launches through complementary tables, summed: the hits over the slots (the device table), the
    misses over the host stack (expert e where the table says -1). Nothing here reads the device on the host."""
    from strata.kernels.moe.gemv import DecodeExperts, moe_gemv

    device_table = cache.device_table
    table = device_table.table[device_table.row[layer]]
    top, w = ids.to(torch.int32), weights.float()
    hits = moe_gemv(x, top, w, DecodeExperts.of_slots(cache.slots, table, stack))
    if layer not in device_table.host_experts:
        device_table.host_experts[layer] = DecodeExperts.of_stack(stack)
    missing = torch.where(table >= 0, -1, device_table.expert_ids)
    return hits + moe_gemv(x, top, w, dataclasses.replace(device_table.host_experts[layer], slot_of=missing))
