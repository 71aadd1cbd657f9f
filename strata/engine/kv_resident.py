"""`--kv-resident N`: the int8 paged KV in host RAM (pinned on CUDA), N cells per layer in VRAM, CLOCK eviction.

Every page lives in the host pools (PagedInt8KV's, on the host); each layer has a device pool of N / 4 slots. A prompt
chunk quantizes its keys and values on the device into a scratch pool of its pages and copies them to the host in
one copy per layer (its pages that were resident are forgotten: their slots held the old bytes). A one-token step
makes its page resident, quantizes into the slot and writes the page back (write-through). The cells a step's
queries attend (the caller's or Quest's selection, else dense causal) are then made resident: CLOCK (engine/clock.py)
picks the victims, and the missing pages travel in one gather per layer (host rows into pinned staging, one copy,
scattered into the slots on the device, with a device slot table of logical page -> slot updated in the same copy).
The same attention kernels then read the slots. A prompt chunk whose queries' pages do not fit the slots reads
them from a transient scratch pool instead (one upload, all its queries in one launch, CLOCK untouched; at most
SCRATCH_BYTES, past which the queries are split). A pool's bytes do not depend on where its pages sit, so the outputs
are those of the all-VRAM cache, byte for byte. Queries whose pages do not fit the slots together are attended in
smaller groups; one query needing more pages than there are slots (dense attention past N cells) is an error: run
it with a selection (`--qsa quest`) or a larger N.
"""

from __future__ import annotations

import numpy as np
import torch

from strata.engine.clock import Clock
from strata.engine.kv_paged import PagedInt8KV, attend_pool
from strata.errors import StrataError
from strata.kernels.attention.kv_int8 import append_kv_ref, append_kv_triton
from strata.kernels.attention.paged import PAGE, PagedKV

HOST = torch.device("cpu")
SCRATCH_BYTES = 256 << 20  # a prompt chunk's transient pool of the pages its queries select, per layer at a time


class ResidentInt8KV(PagedInt8KV):
    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, max_tokens: int, device: torch.device,
                 resident_cells: int, initial_tokens: int = 256, kernels: bool | None = None,
                 scratch_bytes: int = SCRATCH_BYTES):
        if resident_cells < 2 * PAGE:
            raise StrataError(f"--kv-resident {resident_cells}: at least {2 * PAGE} cells per layer")
        self.compute_device = device
        self.pin = device.type == "cuda"  # page-locked host pages and staging: copies at link speed, asynchronous
        super().__init__(n_layers, n_kv_heads, head_dim, max_tokens, HOST, initial_tokens, kernels)
        self.n_slots = resident_cells // PAGE
        self.slots = [PagedKV.empty(self.n_slots, n_kv_heads, head_dim, int8=True, device=device)
                      for _ in range(n_layers)]
        self.clocks = [Clock(self.n_slots) for _ in range(n_layers)]
        # Per layer, logical page -> slot on the device; entries of pages not resident are stale (never read: a
        # step attends only pages it made resident first).
        self.slot_tables = [torch.zeros(0, dtype=torch.int32, device=device) for _ in range(n_layers)]
        rows = n_kv_heads * PAGE
        self.page_bytes = 2 * rows * head_dim + 2 * rows * (head_dim // 64) * 2  # codes and fp16 scales, K and V
        self.staging = torch.empty(0, dtype=torch.uint8)  # host side of a gather (pinned on CUDA)
        self.staged = None  # CUDA event: the last copy out of `staging` is done
        self.fetches = 0  # host-to-device copies of pages (one per layer and step with a miss, or prompt group)
        # A prompt chunk's queries whose pages do not fit the slots read a transient scratch pool of their pages
        # (at most this many): one launch, not one per group of queries whose pages fit the slots.
        self.scratch_pages = max(self.n_slots, scratch_bytes // self.page_bytes)

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

    # ---- making pages resident

    def _admit(self, layer: int, logical: np.ndarray) -> torch.Tensor:
        """Make the logical pages resident (fetching misses in one copy): this layer's device slot table."""
        clock, table = self.clocks[layer], self._slot_table(layer)
        clock.cover(self.n_pages)
        physical = self.page_table.numpy()[logical]
        missed, slots = clock.admit_arrays(physical)
        if len(slots):
            self._fetch(layer, physical[missed], logical[missed], slots, table)
        return table

    def _slot_table(self, layer: int) -> torch.Tensor:
        table = self.slot_tables[layer]
        if table.shape[0] < len(self.pages):
            grown = torch.zeros(max(len(self.pages), 2 * table.shape[0]), dtype=torch.int32, device=table.device)
            grown[: table.shape[0]] = table
            self.slot_tables[layer] = table = grown
        return table

    def _host_staging(self, n_bytes: int) -> torch.Tensor:
        """The host staging buffer, at least n_bytes, once the copy that last read it is done."""
        if self.staged is not None:
            self.staged.synchronize()
            self.staged = None
        if self.staging.numel() < n_bytes:
            self.staging = torch.empty(max(n_bytes, 2 * self.staging.numel()), dtype=torch.uint8, pin_memory=self.pin)
        return self.staging

    def _upload(self, layer: int, pages: np.ndarray, ids: list[np.ndarray]) -> tuple[torch.Tensor, list]:
        """Host pages (physical ids) and int64 id rows `ids` in one copy to the device: gathered into the pinned
        staging buffer, ids first. (ids [len(ids), n] on the device, the pages' codes and scales [n, rows, ...])."""
        n, head = len(pages), 8 * len(ids) * len(pages)
        staging = self._host_staging(head + n * self.page_bytes)[: head + n * self.page_bytes]
        id_rows = staging[:head].view(torch.int64).view(len(ids), n)
        for row, values in zip(id_rows, ids):
            row.copy_(torch.from_numpy(values))
        index = torch.from_numpy(pages)
        for (src, _), dst in zip(_page_views(self.pools[layer], self.slots[layer]),
                                 _packed(staging[head:], self.pools[layer], n)):
            torch.index_select(src, 0, index, out=dst)
        arrived = staging.to(self.compute_device, non_blocking=True)  # the one copy
        if self.pin:
            self.staged = torch.cuda.Event()
            self.staged.record()
        return arrived[:head].view(torch.int64).view(len(ids), n), _packed(arrived[head:], self.pools[layer], n)

    def _fetch(self, layer: int, pages: np.ndarray, logical: np.ndarray, slots: np.ndarray,
               table: torch.Tensor) -> None:
        """Host pages -> their slots (one upload), scattered on the device; the slot table follows."""
        ids, parts = self._upload(layer, pages, [slots, logical])
        for (_, dst), src in zip(_page_views(self.pools[layer], self.slots[layer]), parts):
            dst.index_copy_(0, ids[0], src)
        table.index_copy_(0, ids[1], ids[0].to(torch.int32))
        self.fetches += 1

    def _scratch(self, layer: int, logical: np.ndarray) -> tuple[PagedKV, torch.Tensor]:
        """A prompt chunk's pages in a scratch pool of their own (one upload, CLOCK untouched): (pool, its page
        table of logical page -> scratch page, on the device)."""
        ids, parts = self._upload(layer, self.page_table.numpy()[logical], [logical])
        table = torch.zeros(len(self.pages), dtype=torch.int32, device=self.compute_device)
        table.index_copy_(0, ids[0], torch.arange(len(logical), dtype=torch.int32, device=table.device))
        pool = PagedKV(*(p.flatten(0, 1) for p in parts), self.n_kv_heads)
        self.fetches += 1
        return pool, table

    # ---- writing

    def _store(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor, kernels: bool) -> None:
        end = start + k.shape[0]
        logical = np.arange(start // PAGE, -(-end // PAGE))
        append = append_kv_triton if kernels else append_kv_ref
        cells = torch.arange(start, end, device=k.device)
        if len(logical) == 1:  # a decode step's page: resident (it is attended next), written through
            table = self._admit(layer, logical)
            append(self.slots[layer], table, cells, k, v)
            self._write_back(layer, self.slots[layer], table[torch.from_numpy(logical).to(table.device)], logical)
            return
        # A prompt chunk: a scratch pool of its pages (the first one read back if the chunk starts inside it).
        scratch = PagedKV.empty(len(logical), self.n_kv_heads, self.head_dim, int8=True, device=k.device)
        if start % PAGE:
            first = torch.tensor([self.pages[logical[0]]])
            for src, dst in _page_views(self.pools[layer], scratch):
                dst[:1] = src[first].to(k.device)
        local = torch.arange(len(logical), dtype=torch.int32, device=k.device)
        append(scratch, local, cells - int(logical[0]) * PAGE, k, v)
        self._write_back(layer, scratch, local, logical)
        self.clocks[layer].forget(self.page_table.numpy()[logical].tolist())  # resident copies are stale now

    def _write_back(self, layer: int, pool: PagedKV, rows_of: torch.Tensor, logical: np.ndarray) -> None:
        """Pages `rows_of` (page ids) of the device `pool` -> the host pages of `logical`: packed, one copy."""
        n = len(logical)
        packed = torch.empty(n * self.page_bytes, dtype=torch.uint8, device=pool.k.device)
        ids = rows_of.long()
        for (_, src), dst in zip(_page_views(self.pools[layer], pool), _packed(packed, self.pools[layer], n)):
            torch.index_select(src, 0, ids, out=dst)
        host = self._host_staging(n * self.page_bytes)[: n * self.page_bytes]
        host.copy_(packed)  # waits for the device: the host pages are whole when attend returns
        pages = torch.from_numpy(self.page_table.numpy()[logical]).long()
        for (dst, _), src in zip(_page_views(self.pools[layer], pool), _packed(host, self.pools[layer], n)):
            dst.index_copy_(0, pages, src)

    # ---- attending

    def _attend_cells(self, layer: int, qf: torch.Tensor, ids: torch.Tensor, width: torch.Tensor, kernels: bool,
                      decode: bool) -> torch.Tensor:
        pages = _pages_of(ids, width)
        if len(pages) <= self.n_slots:
            return attend_pool(qf, self.slots[layer], self._admit(layer, pages), ids, width, kernels, decode)
        widest = len(pages) * PAGE if qf.shape[0] == 1 else int(width.max())
        if widest > self.n_slots * PAGE:  # a prompt as its decode steps will: a query must fit the slots
            raise StrataError(f"a query attends {widest} cells, more than --kv-resident "
                              f"{self.n_slots * PAGE} holds (raise it, or select cells: --qsa quest)")
        if len(pages) <= self.scratch_pages:  # a prompt chunk: all its queries in one launch over a scratch pool
            return attend_pool(qf, *self._scratch(layer, pages), ids, width, kernels, decode)
        half = qf.shape[0] // 2  # the queries in two groups whose pages fit better
        return torch.cat([self._attend_cells(layer, qf[rows], ids[rows], width[rows], kernels, decode)
                          for rows in (slice(0, half), slice(half, None))])


def _pages_of(ids: torch.Tensor, width: torch.Tensor) -> np.ndarray:
    """The distinct logical pages of the cells ids[i, :width[i]], ascending (one read back to the host)."""
    used = torch.arange(ids.shape[1], device=ids.device)[None] < width[:, None]
    return torch.unique(ids[used].long() // PAGE).cpu().numpy()


def _page_views(host: PagedKV, dev: PagedKV):
    """(host, device) views [pages, rows of a page, ...] of the codes and scales of both pools."""
    for a, b in ((host.k, dev.k), (host.v, dev.v), (host.k_scale, dev.k_scale), (host.v_scale, dev.v_scale)):
        yield a.unflatten(0, (-1, host.n_kv_heads * PAGE)), b.unflatten(0, (-1, dev.n_kv_heads * PAGE))


def _packed(buffer: torch.Tensor, like: PagedKV, n: int) -> list[torch.Tensor]:
    """Views of a byte buffer as n pages of codes K, V then scales K, V (the layout of a gather's one copy)."""
    views, offset = [], 0
    for t in (like.k, like.v, like.k_scale, like.v_scale):
        shape = (n, like.n_kv_heads * PAGE, t.shape[1])
        size = n * shape[1] * shape[2] * t.element_size()
        views.append(buffer[offset : offset + size].view(t.dtype).view(shape))
        offset += size
    return views
