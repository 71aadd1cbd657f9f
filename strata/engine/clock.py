"""CLOCK replacement for a fixed set of slots: which page each slot holds, a reference bit per slot, one hand.

`admit(pages)` makes a set of pages resident together: hits get their bit set; each miss takes an empty slot if
there is one, else the first slot the hand finds unreferenced (clearing bits as it passes), never one holding a page
of the same set. The sweep is done on whole arrays (numpy), not slot by slot in Python: a decode step admits a
selection of hundreds of pages per layer, a prompt chunk thousands.
"""

from __future__ import annotations

import numpy as np
import torch


class Clock:
    def __init__(self, n_slots: int):
        self.n_slots = n_slots
        self.page_of_slot = np.full(n_slots, -1, dtype=np.int64)
        self.referenced = np.zeros(n_slots, dtype=bool)
        self.slot_of_page = torch.full((0,), -1, dtype=torch.int32)  # by page id; -1: not resident
        self.hand = 0
        self.evictions = 0

    def cover(self, n_pages: int) -> None:
        """Room in slot_of_page for page ids below n_pages."""
        if n_pages > self.slot_of_page.shape[0]:
            grown = torch.full((max(n_pages, 2 * self.slot_of_page.shape[0]),), -1, dtype=torch.int32)
            grown[: self.slot_of_page.shape[0]] = self.slot_of_page
            self.slot_of_page = grown

    def admit(self, pages: list[int] | np.ndarray) -> list[tuple[int, int]]:
        """Make every one of `pages` (distinct, at most n_slots) resident: the (page, slot) pairs to load."""
        pages = np.asarray(pages, dtype=np.int64)
        missed, slots = self.admit_arrays(pages)
        return list(zip(pages[missed].tolist(), slots.tolist()))

    def admit_arrays(self, pages: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`admit` as arrays: (missed: bool [len(pages)], the slots of the missed pages, in their order)."""
        if len(pages) > self.n_slots:
            raise ValueError(f"{len(pages)} pages do not fit {self.n_slots} slots")
        self.cover(int(pages.max(initial=-1)) + 1)
        table = self.slot_of_page.numpy()
        current = table[pages]
        self.referenced[current[current >= 0]] = True
        missed = current < 0
        missing = pages[missed]
        if not len(missing):
            return missed, np.zeros(0, dtype=np.int64)
        slots = self._victims(len(missing), wanted=current[current >= 0])
        old = self.page_of_slot[slots]
        table[old[old >= 0]] = -1
        self.evictions += int((old >= 0).sum())
        self.page_of_slot[slots], self.referenced[slots] = missing, True
        table[missing] = slots
        return missed, slots

    def _victims(self, n: int, wanted: np.ndarray) -> np.ndarray:
        """n slots for misses: the empty ones (lowest first), then what the hand finds, in the order it finds them."""
        empty = np.flatnonzero(self.page_of_slot < 0)[:n]
        if len(empty) == n:
            return empty
        need = n - len(empty)
        order = (self.hand + np.arange(self.n_slots)) % self.n_slots  # the hand's sweep, from where it stands
        spared = np.zeros(self.n_slots, dtype=bool)
        spared[wanted] = True  # a page of the same set is never a victim nor loses its bit
        spared[empty] = True
        first = order[~spared[order] & ~self.referenced[order]]  # taken on the first round
        if len(first) >= need:
            taken = first[:need]
            stop = int(np.flatnonzero(order == taken[-1])[0]) + 1  # the hand passed order[:stop]
            passed = order[:stop]
            self.referenced[passed[~spared[passed]]] = False
        else:  # one whole round clears every bit it may, the second takes the rest in the same order
            self.referenced[order[~spared[order]]] = False
            spared[first] = True
            second = order[~spared[order]][: need - len(first)]
            taken = np.concatenate([first, second])
            stop = int(np.flatnonzero(order == taken[-1])[0]) + 1
        self.hand = int(order[stop - 1] + 1) % self.n_slots
        return np.concatenate([empty, taken])

    def forget(self, pages: list[int]) -> None:
        """Pages whose contents are gone (handed back on truncate): their slots become empty."""
        pages = np.asarray([p for p in pages if p < self.slot_of_page.shape[0]], dtype=np.int64)
        table = self.slot_of_page.numpy()
        slots = table[pages] if len(pages) else np.zeros(0, dtype=np.int64)
        slots = slots[slots >= 0]
        table[pages] = -1
        self.page_of_slot[slots], self.referenced[slots] = -1, False
