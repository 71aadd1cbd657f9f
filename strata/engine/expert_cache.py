"""The GPU expert cache: fixed slots holding experts in their GGUF format, filled from a routing profile and then
adapted to what the model routes to (decayed counts; the most-routed missing experts replace the least-routed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from strata.engine.experts import ExpertStack
from strata.errors import StrataError
from strata.models.weights import QuantWeight

Key = tuple[int, int]  # (layer, expert)


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    swaps: int = 0
    bytes_moved: int = 0
    adapts: int = 0  # times `adapt` ran (`strata bench decode` counts the steps that did)

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else float("nan")


class ExpertCache:
    """`n_slots` slots of `slot_bytes` on `device`; a slot holds one expert's gate, up and down bytes back to back."""

    def __init__(self, stacks: dict[int, ExpertStack], n_slots: int, device: torch.device,
                 decay: float = 0.7, adapt_every: int = 4, adapt_swaps: int = 96):
        self.stacks, self.device = stacks, torch.device(device)
        self.decay, self.adapt_every, self.adapt_swaps = decay, adapt_every, adapt_swaps
        self.slot_bytes = max((s.expert_bytes for s in stacks.values()), default=0)
        self.n_slots = n_slots
        self.slots = torch.empty((n_slots, self.slot_bytes), dtype=torch.uint8, device=self.device)
        self.slot_of: dict[Key, int] = {}
        self.owner: list[Key | None] = [None] * n_slots
        # The owners again as arrays (row of `count_table`, expert; -1 where empty), for adapt's numpy choice.
        self.owner_row = np.full(n_slots, -1, dtype=np.int64)
        self.owner_expert = np.full(n_slots, -1, dtype=np.int64)
        n_experts = max((s.n_experts for s in stacks.values()), default=0)
        # Decayed routing counts, one row a layer (in `stacks` order); `counts[layer]` is a view of its row.
        self.count_table = np.zeros((len(stacks), n_experts), dtype=np.float64)
        self.layer_row = {layer: i for i, layer in enumerate(stacks)}
        self.counts = {layer: torch.from_numpy(self.count_table[i]) for layer, i in self.layer_row.items()}
        self.stats = CacheStats()
        self.steps = 0
        self._in_use: set[Key] = set()
        self._in_use_rows: list[tuple[int, np.ndarray]] = []  # lookups' experts not yet in the set (`in_use`)
        # Copies into slots run on a side stream; a slot counts as a hit only once its copy has landed.
        # High priority: a prompt's gather kernels (engine/copy_queue.py) run here and should take SMs as soon as
        # the layer computing beside them frees any (copies through the copy engines are not affected).
        self.copy_stream = None
        if self.device.type == "cuda":
            from strata.engine.copy_queue import copy_stream_priority

            self.copy_stream = torch.cuda.Stream(self.device, priority=copy_stream_priority())
        self.landing: dict[int, torch.cuda.Event] = {}
        # Slots given back by a prompt and refilled with their former experts: hits at once, behind a wait of the
        # compute stream for their copy, so the placement after a prompt is the one before it whatever the copy's
        # speed (greedy --spec equals plain decoding only with one placement: issue 10). Adapt's swaps stay misses
        # until landed (their timing never stalls a step).
        self.restoring: set[int] = set()
        self.lent: dict[int, Key | None] = {}  # slots lent out (`borrow`) -> the expert each held before
        self.device_table = None  # `--misses direct`: the slot map on the device (engine/direct_misses.py)
        self._queue = None  # the gather launches of `refill` (a CopyQueue on copy_stream), made on first use

    def track_on_device(self) -> None:
        """Keep a device table of what is cached (and count routing on the device) for `--misses direct`."""
        from strata.engine.direct_misses import DeviceTable

        if self.device_table is None:
            self.device_table = DeviceTable(self)

    # ---- what is where

    @property
    def in_use(self) -> set[Key]:
        """The experts routed this step: never evicted or lent before it ends. A prompt chunk's lookups add hundreds
        a layer as arrays; they join the set only when it is read (adapting, lending), not at every layer."""
        if self._in_use_rows:
            for layer, experts in self._in_use_rows:
                self._in_use.update(zip([layer] * len(experts), experts.tolist()))
            self._in_use_rows = []
        return self._in_use

    @in_use.setter
    def in_use(self, keys) -> None:
        self._in_use, self._in_use_rows = set(keys), []

    def _end_use(self) -> None:
        self._in_use.clear()
        self._in_use_rows = []

    def expert_weights(self, layer: int, slot: int) -> tuple[QuantWeight, QuantWeight, QuantWeight]:
        """Views of a slot's bytes shaped like the layer's gate, up and down matrices of one expert."""
        stack, row = self.stacks[layer], self.slots[slot]
        views, offset = [], 0
        for part in (stack.gate, stack.up, stack.down):
            n_rows, row_bytes = part.raw.shape[1], part.raw.shape[2]
            raw = row[offset : offset + n_rows * row_bytes].view(n_rows, row_bytes)
            views.append(QuantWeight(part.name, part.ggml_type, part.shape[1:], raw))
            offset += n_rows * row_bytes
        return tuple(views)

    def _landed(self, slot: int) -> bool:
        event = self.landing.get(slot)
        if event is None:
            return True
        if slot in self.restoring:
            self._wait_on_compute(event)
        elif not event.query():
            return False
        del self.landing[slot]
        self.restoring.discard(slot)
        return True

    def _wait_on_compute(self, event) -> None:
        """Work queued on the compute stream from now on runs after `event` (no host wait)."""
        torch.cuda.current_stream(self.device).wait_event(event)

    def lookup(self, layer: int, experts: list[int]) -> tuple[dict[int, int], list[int]]:
        """Split the experts a layer routes to into hits (expert -> slot) and misses; counts them."""
        hits, misses = {}, []
        for e in experts:
            slot = self.slot_of.get((layer, e))
            if slot is not None and self._landed(slot):
                hits[e] = slot
            else:
                misses.append(e)
            self.in_use.add((layer, e))
        self.counts[layer].numpy()[experts] += 1  # numpy's indexing: ~15 us less a layer than torch's
        self.stats.hits += len(hits)
        self.stats.misses += len(misses)
        return hits, misses

    def _drop_unlanded(self, slots: np.ndarray, pending: list[int]) -> None:
        """`_landed` for slots[i], i in `pending` (slots with a copy event), asking each distinct event once: a
        prompt's first chunk after a refill finds hundreds of restored slots a layer behind one event, where a
        stream wait each cost the host more than the layer's streaming. A slot not landed turns -1 (a miss)."""
        verdicts: dict[tuple[int, bool], bool] = {}
        for i in pending:
            slot = int(slots[i])
            event, restoring = self.landing[slot], slot in self.restoring
            key = (id(event), restoring)
            if key not in verdicts:
                if restoring:
                    self._wait_on_compute(event)
                verdicts[key] = restoring or event.query()
            if verdicts[key]:
                del self.landing[slot]
                self.restoring.discard(slot)
            else:
                slots[i] = -1

    def layer_slots(self, layer: int) -> np.ndarray:
        """The slot of each of the layer's experts, -1 where it is not cached (from the owner arrays, no dict)."""
        table = np.full(self.count_table.shape[1], -1, dtype=np.int64)
        mine = np.flatnonzero(self.owner_row == self.layer_row[layer])
        table[self.owner_expert[mine]] = mine
        return table

    def lookup_slots(self, layer: int, experts: np.ndarray) -> np.ndarray:
        """`lookup` on arrays (a prompt chunk's hundreds of experts, no Python per expert but the few slots whose
        copy may not have landed): the slot of each expert, -1 for a miss; counts them."""
        experts = np.asarray(experts, dtype=np.int64)
        slots = self.layer_slots(layer)[experts]
        if self.landing:
            landing = np.fromiter(self.landing, dtype=np.int64, count=len(self.landing))
            self._drop_unlanded(slots, np.flatnonzero(np.isin(slots, landing)).tolist())
        self._in_use_rows.append((layer, experts))
        self.counts[layer].numpy()[experts] += 1
        hits = int((slots >= 0).sum())
        self.stats.hits += hits
        self.stats.misses += len(experts) - hits
        return slots

    # ---- filling and adapting

    def admit(self, key: Key, slot: int) -> None:
        """Copy an expert's bytes from the host into `slot`, evicting whatever was there."""
        self.admit_many([(key, slot)])

    def admit_many(self, placed: list[tuple[Key, int]], one_launch: bool = False) -> None:
        """Copy experts into slots (distinct slots, experts not cached), evicting what was there: the evictions in
        one table update, one wait for the compute stream and one event for the whole batch (an adapt's swaps cost
        the host a few copy launches each, not a stream wait and an event each). `one_launch`: one gather launch a
        layer instead (a prompt's lent slots refilled at once; decode's swaps keep the copy engines, whose copies
        take no SM time from the steps beside them)."""
        if not placed:
            return
        evicted = []
        for _, slot in placed:
            self.restoring.discard(slot)
            old = self.owner[slot]
            if old is not None:
                del self.slot_of[old]
                evicted.append(old)
        if evicted and self.device_table is not None:
            self.device_table.evicted_many(evicted)
        event = None
        if self.copy_stream is not None:
            # Wait for work already queued on the compute stream, which may still read the old experts.
            self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
        if one_launch:  # the CPU's form runs the same grouping (its copies happen at once: no event)
            landed = self._gather_by_layer(placed)
            event = landed if self.copy_stream is not None else None
        for key, slot in ([] if one_launch else placed):
            layer, e = key
            stack = self.stacks[layer]
            parts = [p.raw[e].reshape(-1) for p in (stack.gate, stack.up, stack.down)]
            n = sum(p.numel() for p in parts)
            if self.copy_stream is None:
                torch.cat(parts, out=self.slots[slot, :n])
            else:
                with torch.cuda.stream(self.copy_stream):
                    offset = 0
                    for p in parts:
                        self.slots[slot, offset : offset + p.numel()].copy_(p, non_blocking=True)
                        offset += p.numel()
            self.stats.bytes_moved += n
        if self.copy_stream is not None and not one_launch:
            event = torch.cuda.Event()
            event.record(self.copy_stream)
        for key, slot in placed:
            if event is not None:
                self.landing[slot] = event
            self.owner[slot] = key
            self.owner_row[slot], self.owner_expert[slot] = self.layer_row[key[0]], key[1]
            self.slot_of[key] = slot
            if self.device_table is not None:
                self.device_table.admitted(key, slot)

    def _gather_by_layer(self, placed: list[tuple[Key, int]]):
        """The copies of `admit_many` as one gather kernel a layer on the copy stream (engine/copy_queue.py), even
        where prompts stream by the copy engines: the refilled experts lie scattered, short runs (a 4K prompt's 2,084
        lent slots on the full qwen4exp took 67 ms of host time in copy calls); returns the event after the last
        (they run in order on one stream)."""
        from strata.engine.copy_queue import CopyQueue

        if self._queue is None:
            self._queue = CopyQueue(self.device, self.copy_stream)
        rows = np.array([(layer, e, slot) for (layer, e), slot in placed], dtype=np.int64).reshape(-1, 3)
        event = None
        for layer in np.unique(rows[:, 0]).tolist():
            mine = rows[rows[:, 0] == layer]
            event = self._queue.gather(self.slots, self.stacks[layer], mine[:, 1], mine[:, 2], kernel=True)
            self.stats.bytes_moved += len(mine) * self.stacks[layer].expert_bytes
        return event

    def fill(self, ranking: list[Key]) -> None:
        """Fill empty slots in the order given (a routing profile's ranking, or an even spread)."""
        free = self.free_slots()
        for key, slot in zip((k for k in ranking if k not in self.slot_of), free):
            self.admit(key, slot)

    def free_slots(self) -> list[int]:
        empty = self.owner_row < 0
        empty[list(self.lent)] = False
        return np.flatnonzero(empty).tolist()

    # ---- lending slots (the prompt's streaming ring)

    def borrow(self, n: int) -> list[int]:
        """Lend n slots: empty ones first, then those of the least-routed experts not in use. Their experts leave the
        cache (lookups miss them) until `refill`; adapting never writes into a lent slot."""
        stuck = self._unlendable()
        residents = np.flatnonzero((self.owner_row >= 0) & ~stuck)
        counts = self.count_table[self.owner_row[residents], self.owner_expert[residents]]
        candidates = self.free_slots() + residents[np.lexsort((residents, counts))].tolist()
        if n > len(candidates):
            raise StrataError(f"the expert cache cannot lend {n} slots: {len(candidates)} are free or evictable")
        return self._lend(candidates[:n])

    def borrow_run(self, n: int) -> list[int]:
        """Lend n adjacent slots (one byte range of `slots`: a prompt chunk's work buffers), the run whose experts
        are routed least (empty slots cost nothing); never a lent slot or an expert in use."""
        stuck = self._unlendable()
        held = (self.owner_row >= 0) & ~stuck
        cost = np.zeros(self.n_slots + 1)  # prefix sums: routing counts of the residents, slots that cannot be lent
        cost[1:][held] = self.count_table[self.owner_row[held], self.owner_expert[held]]
        np.cumsum(cost, out=cost)  # in slot order, as the sums were made one by one before
        blocked = np.concatenate([[0], np.cumsum(stuck)])
        starts = np.arange(self.n_slots - n + 1) if n > 0 else np.arange(0)
        starts = starts[blocked[starts + n] == blocked[starts]]
        if not len(starts):
            raise StrataError(f"the expert cache cannot lend {n} adjacent slots (of {self.n_slots}, "
                              f"{len(self.lent)} lent)")
        run_cost = cost[starts + n] - cost[starts]
        best = int(starts[np.flatnonzero(run_cost == run_cost.min())[0]])  # the cheapest, then the first
        return self._lend(list(range(best, best + n)))

    def _unlendable(self) -> np.ndarray:
        """Slots that cannot be lent: lent already, or holding an expert in use."""
        stuck = np.zeros(self.n_slots, dtype=bool)
        stuck[list(self.lent)] = True
        for key in self.in_use:
            slot = self.slot_of.get(key)
            if slot is not None:
                stuck[slot] = True
        return stuck

    def _lend(self, taken: list[int]) -> list[int]:
        gone = []
        for slot in taken:
            old = self.owner[slot]
            if old is not None:
                del self.slot_of[old]
                self.owner[slot] = None
                self.owner_row[slot] = self.owner_expert[slot] = -1
                gone.append(old)
            self.landing.pop(slot, None)  # a pending admit lands first anyway: copies share the copy stream
            self.restoring.discard(slot)
            self.lent[slot] = old
        if gone and self.device_table is not None:  # one table update, not an upload a slot (a ring lends ~1,000)
            self.device_table.evicted_many(gone)
        return taken

    def refill(self) -> int:
        """Take every lent slot back and copy its former expert in again (unless adapting placed it elsewhere): the
        placement is the one before the lending from the next step on (`restoring`)."""
        lent, self.lent = self.lent, {}
        placed = [(key, slot) for slot, key in lent.items() if key is not None and key not in self.slot_of]
        self.admit_many(placed, one_launch=True)
        restored = [slot for _, slot in placed]
        self.restoring.update(s for s in restored if s in self.landing)
        if self.device_table is not None:  # `--misses direct`: back in the table now, behind a wait for the copies
            self.device_table.publish(slots=set(restored))
        return len(placed)

    def even_ranking(self) -> list[Key]:
        """Without a profile: the same share of every layer, expert 0 first."""
        n = max((s.n_experts for s in self.stacks.values()), default=0)
        return [(layer, e) for e in range(n) for layer in sorted(self.stacks)]

    def end_step(self) -> None:
        """Decay counts; every `adapt_every` steps swap hot missing experts in for cold residents. With a device
        table the counts come back window by window, without a host wait (DeviceTable.end_step)."""
        self.steps += 1
        if self.device_table is not None:
            self.device_table.end_step(self.decay, self.adapt_every, self.adapt)
            self._end_use()
            return
        if self.steps % self.adapt_every == 0:
            self.adapt()
        self.count_table *= self.decay  # every layer's row at once
        self._end_use()

    def adapt(self) -> int:
        """Empty slots fill first, then a missing expert replaces a resident routed less often; never one in use.
        Candidates go hottest first (count, then layer, then expert, descending), residents coldest first (count,
        then slot); the choice is made on numpy arrays (the owners kept as arrays too), not a Python object per
        expert or slot (~100 ms an adapt at the A3B shape's 6,144 experts with tuples, every few tokens)."""
        layers = list(self.counts)
        if not layers:
            return 0
        counts = self.count_table  # [layers, experts] float64, rows in `layers` order
        held = self.owner_row >= 0
        cached = np.zeros(counts.shape, dtype=bool)
        cached[self.owner_row[held], self.owner_expert[held]] = True
        rows, experts = np.nonzero((counts > 0) & ~cached)
        wanted, layer_ids = counts[rows, experts], np.asarray(layers, dtype=np.int64)[rows]
        hottest = np.lexsort((experts, layer_ids, wanted))[::-1][: self.adapt_swaps]
        free = self.free_slots()
        for key in self.in_use:  # an expert in use keeps its slot
            slot = self.slot_of.get(key)
            if slot is not None:
                held[slot] = False
        slots = np.flatnonzero(held)
        resident_counts = counts[self.owner_row[slots], self.owner_expert[slots]]
        coldest = np.lexsort((slots, resident_counts))
        next_cold = 0
        placed = []
        for i in hottest:
            if free:
                slot = free.pop()
            elif next_cold < len(coldest) and resident_counts[coldest[next_cold]] < wanted[i]:
                slot = int(slots[coldest[next_cold]])
                next_cold += 1
            else:
                break
            placed.append(((int(layer_ids[i]), int(experts[i])), slot))
        self.admit_many(placed)
        self.stats.swaps += len(placed)
        self.stats.adapts += 1
        return len(placed)
