"""The ring of device slots that a prompt's streamed experts pass through (slots lent by the expert cache).

A slot is held for a layer from the moment an expert is copied (or found) in it for that layer until the layer's
experts have been launched (`release`). Slots are refilled oldest first, never one that is held, and a copy into a
slot waits for the event recorded at its last release: no copy overwrites an expert a launched kernel may still read.

The bookkeeping is numpy arrays over the ring's positions and one copy launch a batch (`hold_many`), so a layer costs
the host the same whether it streams 3 experts or 500 (issue 6: per-expert Python and copies made the GPU wait).
Events are numbered (`_events`): an array says which event a position waits for, and a batch waits once for each
distinct one.

For the copy engines (STRATA_PF_STREAM=dma) a batch's copies are runs of experts consecutive in the host stacks and
in the slots: the experts of a batch go into the free positions in ascending expert order (the same positions and
events as otherwise, only which expert goes where changes), and the streamer lends the ring adjacent slots in
ascending order where the cache has them, so consecutive positions are consecutive slot rows.
"""

from __future__ import annotations

import numpy as np
import torch

from strata.engine.copy_queue import CopyQueue

Key = tuple[int, int]  # (layer, expert)
NONE = -1
FORGET_AFTER = 32  # events kept before the unreferenced ones are dropped


class SlotRing:
    def __init__(self, slots: torch.Tensor, indices: list[int], queue: CopyQueue, released=None):
        """`slots`: the cache's uint8 [n_slots, slot_bytes]; `indices`: the rows lent to the ring; `released`: an event
        after which those rows may be overwritten (work already queued may read their former experts)."""
        self.slots, self.queue = slots, queue
        self.indices = np.asarray(indices, dtype=np.int64)
        n = len(self.indices)
        self.cursor = 0  # the position to refill first (round robin, skipping held ones)
        self.tenant_layer = np.full(n, NONE, dtype=np.int64)  # what each position holds
        self.tenant_expert = np.full(n, NONE, dtype=np.int64)
        self.held_layer = np.full(n, NONE, dtype=np.int64)  # the layer a position is held for
        self.position: dict[int, np.ndarray] = {}  # layer -> [experts] position in the ring, or NONE
        self._events: dict[int, object] = {0: released}  # number -> event (None: nothing to wait for)
        self._next_event = 1
        self.released = np.zeros(n, dtype=np.int64)  # position -> the event after its last reader
        self.landed = np.full(n, NONE, dtype=np.int64)  # position -> the event when its copy lands (NONE: waited)

    def __len__(self) -> int:
        return len(self.indices)

    def _event(self, event) -> int:
        number = self._next_event
        self._events[number] = event
        self._next_event += 1
        return number

    def _positions(self, layer: int, n_experts: int) -> np.ndarray:
        table = self.position.get(layer)
        if table is None or len(table) < n_experts:
            grown = np.full(n_experts, NONE, dtype=np.int64)
            if table is not None:
                grown[: len(table)] = table
            table = self.position[layer] = grown
        return table

    def find(self, key: Key) -> int | None:
        table = self.position.get(key[0])
        if table is None or key[1] >= len(table) or table[key[1]] == NONE:
            return None
        return int(self.indices[table[key[1]]])

    @property
    def where(self) -> dict[Key, int]:
        """(layer, expert) -> slot of every tenant (for tests and reports)."""
        live = np.flatnonzero(self.tenant_layer != NONE)
        return {(int(self.tenant_layer[p]), int(self.tenant_expert[p])): int(self.indices[p]) for p in live}

    @property
    def held(self) -> dict[int, int]:
        """slot -> the layer it is held for."""
        live = np.flatnonzero(self.held_layer != NONE)
        return {int(self.indices[p]): int(self.held_layer[p]) for p in live}

    def n_free(self) -> int:
        return int((self.held_layer == NONE).sum())

    def hold_many(self, layer: int, stack, experts: np.ndarray,
                  queue: CopyQueue | None = None) -> tuple[np.ndarray, int]:
        """Hold a slot for each of `experts` (distinct, in priority order) of `layer`: the one holding it, or else
        the oldest position not held, into which the expert is copied (one launch for all of them, on `queue`, the
        ring's by default). Returns the slots (NONE past the point where every position was held) and how many
        experts were copied."""
        experts = np.asarray(experts, dtype=np.int64)
        table = self._positions(layer, stack.n_experts)
        found = table[experts]
        present = found != NONE
        self.held_layer[found[present]] = layer
        out = np.full(len(experts), NONE, dtype=np.int64)
        out[present] = self.indices[found[present]]
        wanted = np.flatnonzero(~present)
        if not len(wanted):
            return out, 0
        n = len(self)
        order = (self.cursor + np.arange(n)) % n
        free = order[self.held_layer[order] == NONE][: len(wanted)]
        wanted = wanted[: len(free)]
        if not len(free):
            return out, 0
        if self.queue.dma:  # the copy engines' runs: the batch's experts ascending into the positions in ring order
            wanted = wanted[np.argsort(experts[wanted], kind="stable")]
        self.cursor = int(free[-1] + 1) % n
        evicted = free[self.tenant_layer[free] != NONE]
        for old_layer in np.unique(self.tenant_layer[evicted]).tolist():
            gone = evicted[self.tenant_layer[evicted] == old_layer]
            self.position[old_layer][self.tenant_expert[gone]] = NONE
        new_experts = experts[wanted]
        self.tenant_layer[free], self.tenant_expert[free], self.held_layer[free] = layer, new_experts, layer
        table[new_experts] = free
        out[wanted] = self.indices[free]
        after = [self._events[k] for k in np.unique(self.released[free]).tolist()]
        landed = (queue or self.queue).gather(self.slots, stack, new_experts, self.indices[free], after=after)
        self.landed[free] = self._event(landed)
        return out, len(free)

    def held_for(self, layer: int) -> np.ndarray:
        """The slots held for `layer`."""
        return self.indices[self.held_layer == layer]

    def wait_landed(self, layer: int) -> None:
        """Kernels launched after this read the landed bytes of the slots held for `layer`."""
        mine = np.flatnonzero(self.held_layer == layer)
        for number in np.unique(self.landed[mine]).tolist():
            if number != NONE:
                self.queue.wait(self._events[number])
        self.landed[mine] = NONE
        self._forget()

    def release(self, layer: int) -> None:
        """After the layer's experts are launched: its slots may be refilled once that work is done."""
        mine = self.held_layer == layer
        self.released[mine] = self._event(self.queue.mark())
        self.held_layer[mine] = NONE
        self._forget()

    def _forget(self) -> None:
        """Drop the events no position refers to any more, once there are a few dozen (two scans of the ring)."""
        if len(self._events) <= FORGET_AFTER:
            return
        live = set(np.unique(self.released).tolist()) | set(np.unique(self.landed).tolist())
        self._events = {k: v for k, v in self._events.items() if k in live}
