"""`--qsa quest`: the KV backend's own selection for models without an indexer (kernels/select/quest.py).

The backend calls `observe` after it stores a step's keys: the Quest blocks the step touched get their min/max
recomputed from the keys as stored (read back, so a block rewritten after a truncate forgets its old cells), in
float16 tables that grow with the sequence like the cache. `select` then gives each query its cells, or None while
every query sees at most `budget` cells (the dense path: the same bytes as without Quest).

A captured decode step (engine/static_kv.py) uses the static forms: `cover` sizes the tables for the whole context
before capture, `observe_cells` refreshes the blocks of the step's positions (a device tensor) and `select_span`
scores a fixed span of cells, so neither reads anything back to the host nor changes shape with the position.
"""

from __future__ import annotations

from typing import Callable

import torch

from strata.errors import StrataError
from strata.kernels.select.quest import block_bounds, quest_select

DEFAULT_BUDGET = 2048 + 3  # cells per query, as Strata's indexer selects
BLOCK = 16  # cells per Quest block (Quest's page): the bounds cost 2 x 2 bytes per 16 cells per value
WINDOW = 128  # the newest cells always kept; at most a quarter of the budget, so the bounds choose the rest


class QuestSelector:
    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, device: torch.device,
                 budget: int = DEFAULT_BUDGET, block: int = BLOCK, window: int | None = None):
        window = min(WINDOW, budget // 16 * 4) if window is None else window
        if block % 4:
            raise StrataError(f"the Quest block ({block} cells) must be a multiple of 4")
        if budget < block + window + 4:
            raise StrataError(f"qsa_budget {budget} is below the cells always kept (first block {block} + recent "
                              f"window {window} + 4)")
        self.budget, self.block, self.window = budget, block, window
        self.shape, self.device = (n_kv_heads, head_dim), device
        self.kmin = [torch.zeros((0, *self.shape), dtype=torch.float16, device=device) for _ in range(n_layers)]
        self.kmax = [torch.zeros((0, *self.shape), dtype=torch.float16, device=device) for _ in range(n_layers)]

    @property
    def n_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.kmin, *self.kmax))

    def observe(self, layer: int, start: int, end: int, read_keys: Callable[[int, int], torch.Tensor]) -> None:
        """Cells start..end-1 were just stored: refresh their blocks' bounds from `read_keys(a, b)` [b-a, Hkv, D]."""
        first = start // self.block
        n_blocks = -(-end // self.block)
        lo, hi = block_bounds(read_keys(first * self.block, end).float(), self.block)
        if n_blocks > self.kmin[layer].shape[0]:
            grow = max(n_blocks, 2 * self.kmin[layer].shape[0])
            for tables in (self.kmin, self.kmax):
                grown = torch.zeros((grow, *self.shape), dtype=torch.float16, device=self.device)
                grown[: tables[layer].shape[0]] = tables[layer]
                tables[layer] = grown
        self.kmin[layer][first:n_blocks] = lo.half()
        self.kmax[layer][first:n_blocks] = hi.half()

    def cover(self, n_tokens: int) -> None:
        """Tables for the blocks of positions 0..n_tokens-1, allocated now (a captured step cannot grow them)."""
        n_blocks = -(-n_tokens // self.block)
        for layer in range(len(self.kmin)):
            if n_blocks > self.kmin[layer].shape[0]:
                for tables in (self.kmin, self.kmax):
                    grown = torch.zeros((n_blocks, *self.shape), dtype=torch.float16, device=self.device)
                    grown[: tables[layer].shape[0]] = tables[layer]
                    tables[layer] = grown

    def observe_cells(self, layer: int, positions: torch.Tensor,
                      read_cells: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """`observe` of a step whose (contiguous, ascending) positions [T] are a device tensor: each row's block
        from its cells up to the step's last position. `read_cells(cells [T, block])` gives their keys as stored
        [T, block, Hkv, D] float32; cells past the last position are read clamped and then ignored."""
        last = positions[-1:]
        blocks = positions // self.block
        cells = blocks[:, None] * self.block + torch.arange(self.block, device=positions.device)
        past = (cells > last)[:, :, None, None]
        keys = read_cells(torch.minimum(cells, last))
        lo = keys.masked_fill(past, float("inf")).amin(1)
        hi = keys.masked_fill(past, float("-inf")).amax(1)
        self.kmin[layer].index_copy_(0, blocks, lo.half())  # rows of one block write the same bounds
        self.kmax[layer].index_copy_(0, blocks, hi.half())

    def select_span(self, layer: int, q: torch.Tensor, n_kv: torch.Tensor, span: int,
                    kernels: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """`select`'s cells for queries seeing n_kv [T] (a device tensor) cells, at most `span`: the scores of a
        fixed span (the cells past n_kv score -inf), so the same cells as `select` and static shapes."""
        n_blocks = -(-span // self.block)
        return quest_select(q, self.kmin[layer][:n_blocks], self.kmax[layer][:n_blocks], n_kv, self.block,
                            self.window, self.budget, n_cols=-(-span // 4), kernels=kernels)

    def select(self, layer: int, q: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The cells of queries q [T, H, D] at positions start.. (each sees start+i+1 cells), or None if all fit."""
        end = start + q.shape[0]
        if end <= self.budget:
            return None
        n_blocks = -(-end // self.block)
        n_kv = torch.arange(start + 1, end + 1, device=q.device)
        return quest_select(q, self.kmin[layer][:n_blocks], self.kmax[layer][:n_blocks], n_kv, self.block,
                            self.window, self.budget)
