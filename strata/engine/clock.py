"""CLOCK replacement for a fixed set of slots: which page each slot holds, a reference bit per slot, one hand.

`admit(pages)` makes a set of pages resident together: hits get their bit set; each miss takes an empty slot if
there is one, else the first slot the hand finds unreferenced (clearing bits as it passes), never one holding a page
of the same set.
"""

from __future__ import annotations

import torch


class Clock:
    def __init__(self, n_slots: int):
        self.n_slots = n_slots
        self.page_of_slot = [-1] * n_slots
        self.referenced = [False] * n_slots
        self.slot_of_page = torch.full((0,), -1, dtype=torch.int32)  # by page id; -1: not resident
        self.hand = 0
        self.empty = list(range(n_slots - 1, -1, -1))  # pop() gives the lowest
        self.evictions = 0

    def cover(self, n_pages: int) -> None:
        """Room in slot_of_page for page ids below n_pages."""
        if n_pages > self.slot_of_page.shape[0]:
            grown = torch.full((max(n_pages, 2 * self.slot_of_page.shape[0]),), -1, dtype=torch.int32)
            grown[: self.slot_of_page.shape[0]] = self.slot_of_page
            self.slot_of_page = grown

    def admit(self, pages: list[int]) -> list[tuple[int, int]]:
        """Make every one of `pages` (distinct, at most n_slots) resident: the (page, slot) pairs to load."""
        if len(pages) > self.n_slots:
            raise ValueError(f"{len(pages)} pages do not fit {self.n_slots} slots")
        self.cover(max(pages, default=-1) + 1)
        wanted = set(pages)
        loads = []
        current = self.slot_of_page[torch.tensor(pages, dtype=torch.long)].tolist()  # one lookup for the whole set
        for page, slot in zip(pages, current):
            if slot >= 0:
                self.referenced[slot] = True
                continue
            slot = self._victim(wanted)
            old = self.page_of_slot[slot]
            if old >= 0:
                self.slot_of_page[old] = -1
                self.evictions += 1
            self.page_of_slot[slot], self.referenced[slot] = page, True
            self.slot_of_page[page] = slot
            loads.append((page, slot))
        return loads

    def _victim(self, wanted: set[int]) -> int:
        if self.empty:
            return self.empty.pop()
        while True:
            slot, self.hand = self.hand, (self.hand + 1) % self.n_slots
            page = self.page_of_slot[slot]
            if page in wanted:
                continue
            if self.referenced[slot]:
                self.referenced[slot] = False
                continue
            return slot

    def forget(self, pages: list[int]) -> None:
        """Pages whose contents are gone (handed back on truncate): their slots become empty."""
        for page in pages:
            if page < self.slot_of_page.shape[0] and (slot := int(self.slot_of_page[page])) >= 0:
                self.slot_of_page[page] = -1
                self.page_of_slot[slot], self.referenced[slot] = -1, False
                self.empty.append(slot)
