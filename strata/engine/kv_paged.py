"""The int8 paged KV cache (`kv_dtype="int8"`): Strata's int8 format in pages of 4 cells, one page table.

Per layer one `PagedKV` pool (kernels/attention/paged.py): int8 codes with an fp16 scale per (cell, KV head, 64
values). Physical pages are handed out as the sequence grows (the pools double when none is free, up to the
context) and handed back on truncate, so a prefix stays in place and the rest is rewritten. A step's keys and
values are quantized into the pool first (kv_int8.py's append); the step's queries then attend to every causal cell
read back from the pool: `prompt_attention` (its variant by switch and GPU) for a chunk, the split-K decode kernel
for one token. The Triton kernels run on CUDA, their torch references (fp32) on the CPU. The cells attended are
0..pos (dense causal) or the caller's selection (ids, width), which the kernels take as they are.
"""

from __future__ import annotations

import math

import torch

from strata.engine.kv import KVBackend, Selection, check_kind, check_selection
from strata.engine.staging import upload
from strata.errors import StrataError
from strata.kernels.attention.decode import decode_attn_triton
from strata.kernels.attention.kv_int8 import append_kv_ref, append_kv_triton, gather_kv
from strata.kernels.attention.paged import PAGE, PagedKV
from strata.kernels.attention.prompt import prompt_attention

IDS_ELEMENTS = 1 << 24  # query x cell ids handed to one prompt_attention call (64 MiB of int32)


class PagedInt8KV(KVBackend):
    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, max_tokens: int, device: torch.device,
                 initial_tokens: int = 256, kernels: bool | None = None):
        check_kind("int8", head_dim)
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        self.max_tokens, self.device = max_tokens, device
        self.kernels = kernels  # the Triton kernels (True), the torch references (False); None: kernels on CUDA
        self.max_pages = math.ceil(max_tokens / PAGE)
        n_pages = min(math.ceil(initial_tokens / PAGE), self.max_pages)
        self.pools = [self._new_pool(n_pages) for _ in range(n_layers)]
        self.free = list(range(n_pages - 1, -1, -1))  # physical pages not in use; pop() hands out the lowest
        self.pages: list[int] = []  # the sequence's page table: logical page -> physical page (every layer)
        self._table = torch.zeros(0, dtype=torch.int32, device=device)  # capacity; page_table is its prefix
        self._table_valid = 0  # entries of _table that hold self.pages
        self.page_table = self._table[:0]

    def _new_pool(self, n_pages: int) -> PagedKV:
        return PagedKV.empty(n_pages, self.n_kv_heads, self.head_dim, int8=True, device=self.device)

    @property
    def n_pages(self) -> int:
        """Physical pages in each layer's pool."""
        return self.pools[0].n_pages if self.pools else 0

    @property
    def n_bytes(self) -> int:
        kv = sum(t.numel() * t.element_size() for p in self.pools for t in (p.k, p.v, p.k_scale, p.v_scale))
        return kv + (self.selector.n_bytes if self.selector is not None else 0)

    def read_keys(self, layer: int, begin: int, end: int) -> torch.Tensor:
        cells = torch.arange(begin, end, device=self.page_table.device)
        pool = self.pools[layer]
        return torch.stack([gather_kv(pool, self.page_table, cells, h)[0] for h in range(self.n_kv_heads)], 1)

    def reserve(self, n_tokens: int) -> None:
        if n_tokens > self.max_tokens:
            raise StrataError(f"{n_tokens} tokens exceed the context size of {self.max_tokens} (raise n_ctx)")
        need = math.ceil(n_tokens / PAGE)
        if need <= len(self.pages):
            return
        if need - len(self.pages) > len(self.free):
            self._grow(min(max(self.n_pages + need - len(self.pages) - len(self.free), 2 * self.n_pages),
                           self.max_pages))
        while len(self.pages) < need:
            self.pages.append(self.free.pop())
        self._set_table()

    def _grow(self, n_pages: int) -> None:
        """Pools of `n_pages` physical pages holding the old ones' rows (a page's rows are contiguous)."""
        old = self.n_pages
        for i, pool in enumerate(self.pools):
            grown = self._new_pool(n_pages)
            for src, dst in ((pool.k, grown.k), (pool.v, grown.v), (pool.k_scale, grown.k_scale),
                             (pool.v_scale, grown.v_scale)):
                dst[: src.shape[0]] = src
            self.pools[i] = grown
        self.free = list(range(n_pages - 1, old - 1, -1)) + self.free

    def _set_table(self) -> None:
        """page_table after self.pages grew or shrank at its end: only the new entries are written (a decode
        step that opens a page must not copy the whole context's table), in a buffer that doubles."""
        n = len(self.pages)
        if n > self._table.shape[0]:
            grown = torch.zeros(min(max(n, 2 * self._table.shape[0]), self.max_pages), dtype=torch.int32,
                                device=self.device)
            grown[: self._table_valid] = self._table[: self._table_valid]
            self._table = grown
        if n > self._table_valid:
            # Pinned and queued (staging.upload): a pageable copy would make the host wait for every queued launch
            # (the previous chunk's whole prompt work, at each chunk's reserve).
            self._table[self._table_valid : n] = upload(torch.tensor(self.pages[self._table_valid : n],
                                                                     dtype=torch.int32), self.device)
        self._table_valid = n
        self.page_table = self._table[:n]

    def truncate(self, length: int) -> None:
        """Keep positions 0..length-1: whole pages past them go back to the free list; the rest of the last kept
        page is rewritten before it is read."""
        keep = math.ceil(length / PAGE)
        if keep < len(self.pages):
            self.free.extend(reversed(self.pages[keep:]))
            del self.pages[keep:]
            self._set_table()

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
               selection: Selection | None = None) -> torch.Tensor:
        n_tokens, end = q.shape[0], start + q.shape[0]
        if end > len(self.pages) * PAGE:
            raise StrataError(f"the int8 KV cache holds pages for {len(self.pages) * PAGE} positions, "
                              f"not {end} (reserve first)")
        kernels = q.is_cuda if self.kernels is None else self.kernels
        self._store(layer, start, k, v, kernels)
        selection = self.own_selection(layer, q, start, selection)
        qf = q.float()
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        for q0, q1, ids, width in query_chunks(n_tokens, start, selection, q.device):
            out[q0:q1] = self._attend_cells(layer, qf[q0:q1], ids, width, kernels, decode=n_tokens == 1)
        return out

    def _store(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor, kernels: bool) -> None:
        """Quantize this step's keys and values into the pool (kv_int8.py's append)."""
        cells = torch.arange(start, start + k.shape[0], device=k.device)
        (append_kv_triton if kernels else append_kv_ref)(self.pools[layer], self.page_table, cells, k, v)

    def _attend_cells(self, layer: int, qf: torch.Tensor, ids: torch.Tensor, width: torch.Tensor, kernels: bool,
                      decode: bool) -> torch.Tensor:
        """fp32 attention of qf over its cells: the decode kernel for a one-token step, else the prompt kernel."""
        return attend_pool(qf, self.pools[layer], self.page_table, ids, width, kernels, decode)


def attend_pool(qf: torch.Tensor, pool: PagedKV, table: torch.Tensor, ids: torch.Tensor, width: torch.Tensor,
                kernels: bool, decode: bool) -> torch.Tensor:
    if decode and kernels:
        return decode_attn_triton(qf, pool, table, ids, width)
    return prompt_attention(qf, pool, table, ids, width, reference=not kernels)


def query_chunks(n_tokens: int, start: int, selection: Selection | None, device: torch.device):
    """(q0, q1, ids, width) per attention call: the caller's selection in one call; dense causal (query i selects
    cells 0..start+i, ascending) in chunks of at most IDS_ELEMENTS ids."""
    if selection is not None:
        ids, width = check_selection(selection, n_tokens)
        yield 0, n_tokens, ids.to(torch.int32).contiguous(), width.to(torch.int32).contiguous()
        return
    end = start + n_tokens
    step = max(1, IDS_ELEMENTS // end)
    for q0 in range(0, n_tokens, step):
        q1 = min(q0 + step, n_tokens)
        cap = start + q1
        ids = torch.arange(cap, dtype=torch.int32, device=device).expand(q1 - q0, cap)
        width = torch.arange(start + q0 + 1, cap + 1, dtype=torch.int32, device=device)
        yield q0, q1, ids, width
