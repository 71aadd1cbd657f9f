"""The ring of device slots that a prompt's streamed experts pass through (slots lent by the expert cache).

A slot is held for a layer from the moment an expert is copied (or found) in it for that layer until the layer's
experts have been launched (`release`). Slots are refilled oldest first, never one that is held, and a copy into a
slot waits for the event recorded at its last release: no copy overwrites an expert a launched kernel may still read.
"""

from __future__ import annotations

from collections import deque

import torch

from strata.engine.copy_queue import CopyQueue

Key = tuple[int, int]  # (layer, expert)


class SlotRing:
    def __init__(self, slots: torch.Tensor, indices: list[int], queue: CopyQueue, released=None):
        """`slots`: the cache's uint8 [n_slots, slot_bytes]; `indices`: the rows lent to the ring; `released`: an event
        after which those rows may be overwritten (work already queued may read their former experts)."""
        self.slots, self.queue = slots, queue
        self.indices = list(indices)
        self.order = deque(self.indices)  # the next slot to refill first
        self.tenant: dict[int, Key] = {}
        self.where: dict[Key, int] = {}
        self.held: dict[int, int] = {}  # slot -> the layer it is held for
        self.released = {s: released for s in self.indices}  # slot -> event after its last reader
        self.landed: dict[int, object] = {}  # slot -> event when its copy lands

    def __len__(self) -> int:
        return len(self.indices)

    def find(self, key: Key) -> int | None:
        return self.where.get(key)

    def n_free(self) -> int:
        return len(self.indices) - len(self.held)

    def hold(self, key: Key, parts: list[torch.Tensor]) -> tuple[int | None, bool]:
        """The slot holding `key` for its layer, copying `parts` (the expert's host bytes) into the oldest slot not
        held when it is not there already: (slot, copied), or (None, False) when every slot is held."""
        slot = self.where.get(key)
        if slot is not None:
            self.held[slot] = key[0]
            return slot, False
        for _ in range(len(self.order)):
            slot = self.order.popleft()
            self.order.append(slot)
            if slot not in self.held:
                break
        else:
            return None, False
        old = self.tenant.pop(slot, None)
        if old is not None:
            del self.where[old]
        self.tenant[slot], self.where[key], self.held[slot] = key, slot, key[0]
        self.landed[slot] = self.queue.copy(self.slots[slot], parts, after=self.released[slot])
        return slot, True

    def held_for(self, layer: int) -> list[int]:
        return [s for s, held_layer in self.held.items() if held_layer == layer]

    def wait_landed(self, slots) -> None:
        """Kernels launched after this read the landed bytes of these slots."""
        for slot in slots:
            self.queue.wait(self.landed.pop(slot, None))

    def release(self, layer: int) -> None:
        """After the layer's experts are launched: its slots may be refilled once that work is done."""
        event = self.queue.mark()
        for slot in self.held_for(layer):
            self.released[slot] = event
            del self.held[slot]
