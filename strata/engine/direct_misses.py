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
- an admitted expert's entry is set at the first window end at least a step after its copy was queued, behind a
  wait of the compute stream for that copy (on the GPU: free once it has landed), so the steps that read it from
  its slot do not depend on how fast the copy went.

Adapting never makes a step wait (issue 4: reading the counts synchronously drained the GPU's queue every
`adapt_every` steps, and the host then decided and queued the swaps with the GPU idle). Routing counts accumulate on
the device (one index_add a layer). A *window* of steps ends with a non-blocking copy of the counts into a pinned
host buffer and an event (`Readout`); the host takes a readout in at a later step, once its event has completed
(`query`, never `synchronize`), while the GPU runs that step: hits and misses against the table the window ran
with, decayed counts, and for the window that ends an adapt period, the swaps. The table only changes right after
a window ends, so every window ran with one table and the hit counts are exact. Schedule, for adapt_every = 4:
the window ending at step 4k is taken in at step 4k+1 (a decode step reads its token on the host, so the copy has
landed by then), which first ends the window (4k, 4k+1]. Decode reads each token before the next step, so the
schedule, the decayed counts and the swaps depend only on the sequence of steps; on the CPU the copies are done
when queued (no event) and the same code runs.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from strata import switches
from strata.engine.experts import PROMPT_KERNEL_MIN_TOKENS
from strata.engine.staging import upload
from strata.errors import StrataError


@dataclasses.dataclass
class Readout:
    """A closed window of steps: its device counts on their way to a host buffer, and the slot map they ran with."""

    counts: torch.Tensor  # float32 [layers, experts] on the host (pinned on CUDA); valid once `landed` has fired
    table: np.ndarray  # int32 [layers, experts]: the table every step of the window ran with
    landed: "torch.cuda.Event | None"  # None on the CPU: the copy is done when queued
    steps: int = 0
    adapt: bool = False  # the window that ends an adapt period: the swaps follow its taking in
    counted: np.ndarray | None = None  # what `read_stats` already added to the hit counters

    def ready(self) -> bool:
        return self.landed is None or self.landed.query()

    def wait(self) -> None:
        if self.landed is not None:
            self.landed.synchronize()


class DeviceTable:
    """The cache's (layer, expert) -> slot map on its device, kept by ExpertCache's admit/evict hooks, plus the
    per-expert routing counts a captured step adds to, read back window by window (`end_step`)."""

    def __init__(self, cache):
        self.cache = cache
        self.row = {layer: i for i, layer in enumerate(sorted(cache.stacks))}
        n_experts = max((s.n_experts for s in cache.stacks.values()), default=0)
        self.shape = (len(self.row), n_experts)
        self.host = torch.full(self.shape, -1, dtype=torch.int32)  # what the device table holds, mirrored
        self.host_numpy = self.host.numpy()  # the same memory, for element access without torch's per-call cost
        # `cache.count_table`'s row of each of this table's rows (both one a layer; their orders may differ).
        self.count_rows = np.array([cache.layer_row[layer] for layer in self.row], dtype=np.int64)
        self.table = self.host.to(cache.device)
        self.cuda = self.table.is_cuda
        self.routed = torch.zeros(self.shape, dtype=torch.float32, device=cache.device)
        self.expert_ids = torch.arange(n_experts, dtype=torch.int32, device=cache.device)
        # The table's complement, kept beside it (expert e where the table says -1, else -1): the misses' GEMV reads
        # it, where working it out in the step took two kernels a layer.
        self.missing = self.expert_ids.repeat(len(self.row), 1)
        # index_add's source: a step taking this path has < PROMPT_KERNEL_MIN_TOKENS rows of at most n_experts pairs
        self.ones = torch.ones(PROMPT_KERNEL_MIN_TOKENS * n_experts, dtype=torch.float32, device=cache.device)
        self.minus_one = torch.tensor(-1, dtype=torch.int32, device=cache.device)
        self.waiting = {slot: key for key, slot in cache.slot_of.items()}  # admitted, not yet in the table
        self.clock = 0  # steps ended
        self.admitted_at = {slot: 0 for slot in self.waiting}  # the clock when each waiting admit was queued
        self.host_experts: dict = {}  # layer -> its pinned host stack as the decode kernels read it
        # The misses' GEMVs run on this stream beside the hits' (forked and joined each layer, captured alike):
        # they wait on PCIe, the hits on HBM.
        self.miss_stream = torch.cuda.Stream(cache.device) if self.cuda else None
        self.window = 0  # steps since the last window ended
        self.since_adapt = 0  # steps since the last adapt period ended
        self.pending: list[Readout] = []  # closed windows not yet taken in, oldest first
        self.spare: list[Readout] = []  # taken-in readouts' buffers, reused (no allocation in steady decode)
        self.counted: np.ndarray | None = None  # the open window's counts `read_stats` already added
        self.sync = switches.get("STRATA_ADAPT_SYNC")  # the old schedule, for before/after runs
        self.copy_misses = switches.get("STRATA_MISSES_COPY")
        self.skip_hits_only = switches.get("STRATA_MISSES_SKIP")
        if self.skip_hits_only and self.cuda and not hasattr(torch.cuda.CUDAGraph, "begin_capture_to_if_node"):
            raise StrataError(f"STRATA_MISSES_SKIP needs conditional CUDA graph nodes, which torch {torch.__version__} "
                              "lacks (begin_capture_to_if_node; CUDA 12.4+)")
        # Copied misses: the down parts cross on this stream while the gate/up GEMV runs (forked and joined, captured)
        self.overlap_stream = torch.cuda.Stream(cache.device) if self.cuda and self.copy_misses else None
        self.scratch: dict[tuple[int, int], torch.Tensor] = {}  # (pairs, slot bytes) -> copied misses' slots
        self.scratch_table = torch.full((n_experts,), -1, dtype=torch.int32, device=cache.device)
        self.publish()

    # ---- the table

    def evicted(self, key) -> None:
        """Before the slot of `key` is overwritten (or lent): from now on the step reads it from the host."""
        self.evicted_many([key])

    def evicted_many(self, keys) -> None:
        """Several evictions in one launch (an adapt's swaps), queued on the compute stream."""
        self._table_changes()
        gone = set(keys)
        rows, experts = [], []
        for layer, e in gone:
            row = self.row[layer]
            if self.host_numpy[row, e] >= 0:
                rows.append(row)
                experts.append(e)
        if rows:
            self.host_numpy[rows, experts] = -1
            index = (self._upload(rows), self._upload(experts))
            self.table.index_put_(index, self.minus_one)
            self.missing.index_put_(index, index[1].to(torch.int32))
        if self.waiting:
            self.waiting = {s: k for s, k in self.waiting.items() if k not in gone}
            self.admitted_at = {s: t for s, t in self.admitted_at.items() if s in self.waiting}

    def admitted(self, key, slot: int) -> None:
        self.waiting[slot] = key
        self.admitted_at[slot] = self.clock

    def publish(self, min_age: int = 0, slots: set[int] | None = None) -> None:
        """Enter the admitted experts queued at least `min_age` steps ago (`slots`: those of these slots only; one
        upload, no host wait). The compute stream waits for their copies first (a wait on the GPU, free once they
        have landed), so which step first reads an expert from its slot depends on the steps alone, not on how fast
        the copies went."""
        entered = [(slot, key) for slot, key in self.waiting.items() if self.clock - self.admitted_at[slot] >= min_age
                   and (slots is None or slot in slots)]
        if not entered:
            return
        self._table_changes()
        if self.cuda:
            events = {id(e): e for e in (self.cache.landing.get(slot) for slot, _ in entered) if e is not None}
            stream = torch.cuda.current_stream(self.table.device)
            for event in events.values():
                stream.wait_event(event)
        rows = [self.row[key[0]] for _, key in entered]
        experts = [key[1] for _, key in entered]
        slots = [slot for slot, _ in entered]
        self.host_numpy[rows, experts] = slots
        index = (self._upload(rows), self._upload(experts))
        self.table.index_put_(index, self._upload(slots, torch.int32))
        self.missing.index_put_(index, self.minus_one)
        for slot in slots:
            del self.waiting[slot]
            del self.admitted_at[slot]

    def _table_changes(self) -> None:
        """Before the table changes: steps since the last window ran with the table as it is, so end their window
        (a no-op inside `end_step`, which ends one first; a prompt's lent slots change it between windows)."""
        if self.window:
            self._close(adapt=False)

    def _upload(self, values: list[int], dtype=torch.long) -> torch.Tensor:
        """A small host list onto the table's device without a host wait (`staging.upload`)."""
        return upload(torch.tensor(values, dtype=dtype), self.table.device)

    def miss_scratch(self, pairs: int, host) -> tuple[torch.Tensor, torch.Tensor]:
        """Copied misses' device slots for a step of `pairs` (token, expert) pairs, and their table expert -> slot.
        Buffers are kept for good (a captured step's graph holds its address) and shared by every step they fit:
        steps run one after another, layers too (each joins the miss stream before the next)."""
        from strata.kernels.moe.miss_copy import scratch_bytes

        slot = scratch_bytes(host)
        fits = [n for n, b in self.scratch if n >= pairs and b == slot]
        if not fits:
            self.scratch[(pairs, slot)] = torch.empty(pairs, slot, dtype=torch.uint8, device=self.table.device)
            fits = [pairs]
        return self.scratch[(min(fits), slot)][:pairs], self.scratch_table

    # ---- routing counts

    def count(self, layer: int, ids: torch.Tensor) -> None:
        """Inside a step: the layer's routing, added to the device counts (capturable: no host work)."""
        flat = ids.reshape(-1)
        self.routed[self.row[layer]].index_add_(0, flat.long(), self.ones[: flat.numel()])

    def end_step(self, decay: float, adapt_every: int, adapt) -> None:
        """After each step: take in the readouts that have landed; where one ends an adapt period (or this step
        ends one), end the open window first, since what follows may change the table; then `adapt()`."""
        self.window += 1
        self.since_adapt += 1
        self.clock += 1
        if self.sync:
            if self.since_adapt >= adapt_every:  # wait for this step's counts (draining the queue), adapt at once
                self._close(adapt=True)
                self.since_adapt = 0
                ready, self.pending = self.pending, []
                for readout in ready:
                    readout.wait()
                    self._take_in(readout, decay)
                adapt()
                self.publish(min_age=1)
            return
        n_ready = 0
        while n_ready < len(self.pending) and self.pending[n_ready].ready():
            n_ready += 1
        ready, self.pending = self.pending[:n_ready], self.pending[n_ready:]
        adapting = any(r.adapt for r in ready)
        due = self.since_adapt >= adapt_every
        if adapting or due:
            self._close(adapt=due)  # the window's steps all ran with the table as it is now
            if due:
                self.since_adapt = 0
        for readout in ready:
            self._take_in(readout, decay)
            if readout.adapt:
                adapt()
        if adapting or due:
            self.publish(min_age=1)  # the admits of earlier steps (this step's own copies have barely started)

    def _close(self, adapt: bool) -> None:
        """End the open window: its counts copied to the host (non-blocking, then an event), the device's zeroed."""
        readout = self.spare.pop() if self.spare else Readout(
            torch.zeros(self.shape, dtype=torch.float32, pin_memory=self.cuda),
            np.zeros(self.shape, dtype=np.int32), torch.cuda.Event() if self.cuda else None)
        readout.counts.copy_(self.routed, non_blocking=True)
        self.routed.zero_()
        if readout.landed is not None:
            readout.landed.record(torch.cuda.current_stream(self.table.device))
        np.copyto(readout.table, self.host_numpy)
        readout.steps, readout.adapt, readout.counted = self.window, adapt, self.counted
        self.counted = None
        self.window = 0
        self.pending.append(readout)

    def _take_in(self, readout: Readout, decay: float) -> None:
        """A landed window into the hit counters and the cache's decayed counts."""
        counts = readout.counts.numpy().astype(np.float64)
        self._tally(counts if readout.counted is None else counts - readout.counted, readout.table)
        kept = self.cache.count_table
        kept *= decay ** readout.steps  # the window's steps, as if decayed one by one
        kept[self.count_rows] += counts[:, : kept.shape[1]]
        self.spare.append(readout)

    def _tally(self, routed: np.ndarray, table: np.ndarray) -> None:
        cached = table >= 0
        stats = self.cache.stats
        stats.hits += int(routed[cached].sum())
        stats.misses += int(routed[~cached].sum())

    def read_stats(self) -> None:
        """Bring the hit counters up to now for a reader (a benchmark, a test): waits for the device (only when
        asked), and leaves the windows, the decayed counts and the swaps exactly as they would have been."""
        for readout in self.pending:
            readout.wait()
            counts = readout.counts.numpy().astype(np.float64)
            self._tally(counts if readout.counted is None else counts - readout.counted, readout.table)
            readout.counted = counts
        live = self.routed.cpu().numpy().astype(np.float64)
        self._tally(live if self.counted is None else live - self.counted, self.host_numpy)
        self.counted = live


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
    row = device_table.row[layer]
    top, w = ids.to(torch.int32), weights.float()
    if layer not in device_table.host_experts:
        device_table.host_experts[layer] = DecodeExperts.of_stack(stack)
    host = device_table.host_experts[layer]
    side = device_table.miss_stream
    if side is None or switches.get("STRATA_MISSES_SERIAL"):
        hits = moe_gemv(x, top, w, DecodeExperts.of_slots(cache.slots, device_table.table[row], stack))
        return hits + miss_gemv(device_table, host, stack, row, x, top, w)
    main = torch.cuda.current_stream(x.device)
    side.wait_stream(main)  # x, ids and weights are ready
    with torch.cuda.stream(side):
        if device_table.skip_hits_only:
            misses = only_if_missed(top, device_table.missing[row], x,
                                    lambda: miss_gemv(device_table, host, stack, row, x, top, w))
        else:
            misses = miss_gemv(device_table, host, stack, row, x, top, w)
    hits = moe_gemv(x, top, w, DecodeExperts.of_slots(cache.slots, device_table.table[row], stack))
    main.wait_stream(side)
    return hits + misses


COPY_MAX_PAIRS = 80  # copied misses' scratch holds a slot a pair: decode and verify windows (8 tokens x top 10);
# longer direct steps (short prompts) read in place rather than hold hundreds of MB of scratch


def miss_gemv(device_table: DeviceTable, host, stack, row: int, x: torch.Tensor, top: torch.Tensor,
              w: torch.Tensor) -> torch.Tensor:
    """The misses' GEMVs: read in place from the host stacks (zero-copy, on `miss_tiles`' tiles), or with
    STRATA_MISSES_COPY copied into device scratch by one gather launch first, then the hits' kernels and tiles
    (where the experts are 16-byte aligned and the step has at most COPY_MAX_PAIRS pairs)."""
    from strata.kernels.moe.gemv import DecodeExperts, moe_gemv, moe_gemv_triton
    from strata.kernels.moe.miss_copy import copyable
    from strata.kernels.moe.miss_tiles import miss_configs

    missing = device_table.missing[row]
    if device_table.copy_misses and top.numel() <= COPY_MAX_PAIRS and copyable(host):  # else in place
        scratch, table = device_table.miss_scratch(top.numel(), host)
        overlap = device_table.overlap_stream if not device_table.skip_hits_only else None
        return copied_misses(x, top, w, host, stack, missing, scratch, table, overlap)
    in_place = dataclasses.replace(host, slot_of=missing, sparse=True)
    configs = miss_configs(host, top.shape[1]) if x.is_cuda else (None, None)
    if configs == (None, None):
        return moe_gemv(x, top, w, in_place)
    return moe_gemv_triton(x, top, w, in_place, x.dtype, configs)


def only_if_missed(top: torch.Tensor, missing: torch.Tensor, like: torch.Tensor, misses_fn) -> torch.Tensor:
    """STRATA_MISSES_SKIP: misses_fn() inside a conditional node of the graph being captured, taken only when some
    routed expert is missing (`miss_flag.any_missed`); else zeros (a memset). Not capturing (eager steps, the CPU):
    misses_fn() always, which gives zeros for a step without misses too (every pair adds exactly zero)."""
    from strata.kernels.moe.miss_flag import any_missed

    if not (like.is_cuda and torch.cuda.is_current_stream_capturing()):
        return misses_fn()
    flag = any_missed(top, missing)
    out = torch.zeros_like(like)
    graph = torch.cuda.CUDAGraph.get_currently_capturing_graph()
    graph.begin_capture_to_if_node(flag)
    try:
        out.copy_(misses_fn())
    finally:
        graph.end_capture_to_conditional_node()
    return out


def copied_misses(x, top, w, host, stack, missing, scratch, table, overlap=None, out_dtype=None) -> torch.Tensor:
    """STRATA_MISSES_COPY's misses: copy_misses into scratch, then the hits' GEMVs over it. With `overlap` (a
    stream; on the GPU) the gate/up parts are copied first, then the down parts on `overlap` while the gate/up GEMV
    runs on this stream, joined before the down GEMV: the same launches on the same bytes, so the same output."""
    from strata.kernels.moe.gemv import DecodeExperts, down_sum_triton, gate_up_swiglu_triton, moe_gemv
    from strata.kernels.moe.miss_copy import DOWN, GATE_UP, copy_misses

    experts = DecodeExperts.of_slots(scratch, table, stack)
    if overlap is None or not x.is_cuda:
        copy_misses(top, missing, host, scratch, table)
        return moe_gemv(x, top, w, experts, out_dtype)
    here = torch.cuda.current_stream(x.device)
    copy_misses(top, missing, host, scratch, table, parts=GATE_UP)
    overlap.wait_stream(here)  # after the gate/up parts (and the last layer's down GEMV, which read the scratch)
    with torch.cuda.stream(overlap):
        copy_misses(top, missing, host, scratch, table, parts=DOWN)
    h = gate_up_swiglu_triton(x, top, experts)
    here.wait_stream(overlap)
    return down_sum_triton(h, top, w, experts, out_dtype or x.dtype)
