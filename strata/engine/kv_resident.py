"""`--kv-resident N`: the int8 paged KV in host RAM (pinned on CUDA), N cells per layer in VRAM, CLOCK eviction.

Every page lives in the host pools (PagedInt8KV's, on the host); each layer has a device pool of N / 4 slots. A step
first makes the pages it writes resident, quantizes into them on the device and copies them back (write-through),
then for the cells its queries attend (the caller's or Quest's selection, else dense causal) makes their pages
resident, fetching misses, and runs the same attention kernels through a page table of slots. A pool's bytes do
not depend on where its pages sit, so the outputs are those of the all-VRAM cache, byte for byte. Queries whose
pages do not fit the slots together are attended in smaller groups; one query needing more pages than there are
slots (dense attention past N cells) is an error: run it with a selection (`--qsa quest`) or a larger N.
"""

from __future__ import annotations

import torch

from strata.engine.clock import Clock
from strata.engine.kv_paged import PagedInt8KV, attend_pool
from strata.errors import StrataError
from strata.kernels.attention.kv_int8 import append_kv_ref, append_kv_triton
from strata.kernels.attention.paged import PAGE, PagedKV

HOST = torch.device("cpu")


class ResidentInt8KV(PagedInt8KV):
    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, max_tokens: int, device: torch.device,
                 resident_cells: int, initial_tokens: int = 256, kernels: bool | None = None):
        if resident_cells < 2 * PAGE:
            raise StrataError(f"--kv-resident {resident_cells}: at least {2 * PAGE} cells per layer")
        self.compute_device = device
        self.pin = device.type == "cuda"  # page-locked host pages (gathered misses still go through a pageable copy)
        super().__init__(n_layers, n_kv_heads, head_dim, max_tokens, HOST, initial_tokens, kernels)
        self.n_slots = resident_cells // PAGE
        self.slots = [PagedKV.empty(self.n_slots, n_kv_heads, head_dim, int8=True, device=device)
                      for _ in range(n_layers)]
        self.clocks = [Clock(self.n_slots) for _ in range(n_layers)]

    def _new_pool(self, n_pages: int) -> PagedKV:
        pool = super()._new_pool(n_pages)
        if self.pin:
            pool = PagedKV(*(t.pin_memory() for t in (pool.k, pool.v, pool.k_scale, pool.v_scale)), pool.n_kv_heads)
        return pool

    @property
    def n_bytes(self) -> int:
        return super().n_bytes + self.device_bytes

    @property
    def device_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for p in self.slots for t in (p.k, p.v, p.k_scale, p.v_scale))

    @property
    def evictions(self) -> int:
        return sum(c.evictions for c in self.clocks)

    def truncate(self, length: int) -> None:
        gone = self.pages[-(-length // PAGE):]
        super().truncate(length)
        for clock in self.clocks:
            clock.forget(gone)

    def _admit(self, layer: int, logical_pages: list[int]) -> torch.Tensor:
        """Make the pages resident (fetching misses from the host): the slot page table for this layer, on the
        device (every logical page -> its slot, 0 where not resident)."""
        host, dev = self.pools[layer], self.slots[layer]
        clock = self.clocks[layer]
        clock.cover(self.n_pages)
        loads = clock.admit([self.pages[p] for p in logical_pages])
        if loads:
            pages = torch.tensor([p for p, _ in loads])
            slots = torch.tensor([s for _, s in loads], device=self.compute_device)
            for src, dst in _page_views(host, dev):
                dst[slots] = src[pages].to(self.compute_device)
        table = clock.slot_of_page[self.page_table.long()].clamp(min=0)
        return table.to(self.compute_device)

    def _store(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor, kernels: bool) -> None:
        end = start + k.shape[0]
        for first in range(start // PAGE, -(-end // PAGE), self.n_slots):  # at most n_slots pages at a time
            logical = list(range(first, min(first + self.n_slots, -(-end // PAGE))))
            c0, c1 = max(start, first * PAGE), min(end, (logical[-1] + 1) * PAGE)
            table = self._admit(layer, logical)
            cells = torch.arange(c0, c1, device=k.device)
            append = append_kv_triton if kernels else append_kv_ref
            append(self.slots[layer], table, cells, k[c0 - start : c1 - start], v[c0 - start : c1 - start])
            pages = torch.tensor([self.pages[p] for p in logical])
            slots = table[torch.tensor(logical, device=table.device)].long()
            for host, dev in _page_views(self.pools[layer], self.slots[layer]):
                host[pages] = dev[slots].to(HOST)  # write-through: the host copy stays whole

    def _attend_cells(self, layer: int, qf: torch.Tensor, ids: torch.Tensor, width: torch.Tensor, kernels: bool,
                      decode: bool) -> torch.Tensor:
        pages = _pages_of(ids, width)
        if len(pages) <= self.n_slots:
            return attend_pool(qf, self.slots[layer], self._admit(layer, pages), ids, width, kernels, decode)
        if qf.shape[0] == 1:
            raise StrataError(f"a query attends {len(pages) * PAGE} cells, more than --kv-resident "
                              f"{self.n_slots * PAGE} holds (raise it, or select cells: --qsa quest)")
        half = qf.shape[0] // 2  # the queries in two groups whose pages fit better
        return torch.cat([self._attend_cells(layer, qf[rows], ids[rows], width[rows], kernels, decode)
                          for rows in (slice(0, half), slice(half, None))])


def _pages_of(ids: torch.Tensor, width: torch.Tensor) -> list[int]:
    """The distinct logical pages of the cells ids[i, :width[i]], ascending."""
    used = torch.arange(ids.shape[1], device=ids.device)[None] < width[:, None]
    return torch.unique(ids[used].long() // PAGE).tolist()


def _page_views(host: PagedKV, dev: PagedKV):
    """(host, device) views [pages, rows of a page, ...] of the codes and scales of both pools."""
    for a, b in ((host.k, dev.k), (host.v, dev.v), (host.k_scale, dev.k_scale), (host.v_scale, dev.v_scale)):
        yield a.unflatten(0, (-1, host.n_kv_heads * PAGE)), b.unflatten(0, (-1, dev.n_kv_heads * PAGE))
