"""The (token, expert) pairs of a prompt chunk grouped by expert on the GPU, padded into 64-row tiles (or 128).

Three kernels and no host sync: a histogram of the expert ids, one program that scans it into each expert's first
row (a multiple of the tile's rows) and the tile list, and a placement that gives every pair a row with an atomic counter per
expert (the order inside an expert is arbitrary; every row's result is computed on its own, so it does not matter).
The tile count is only known on the device: buffers are sized for the most tiles the chunk can need, and kernels
launched over `max_tiles` tiles stop at `n_tiles`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from strata.kernels.moe.dispatch import use_triton

TILE_ROWS = 64


@dataclass
class Grouping:
    """Where each routed pair lives in the grouped layout. Pair i is (token i // top_k, expert ids.flatten()[i])."""

    n_experts: int
    top_k: int
    max_tiles: int  # host-side bound: buffers have max_tiles * tile_rows rows
    counts: torch.Tensor  # int32 [E]: pairs per expert
    starts: torch.Tensor  # int32 [E + 1]: each expert's first row (a multiple of tile_rows); starts[E] = rows in use
    pair_row: torch.Tensor  # int32 [T * top_k]: the row of each pair
    row_token: torch.Tensor  # int32 [max_tiles * tile_rows]: the token of each row, -1 for padding
    tile_expert: torch.Tensor  # int32 [max_tiles]: the expert of each tile (tile t holds rows tile_rows * t onward), -1 past the end
    n_tiles: torch.Tensor  # int32 [1]
    tile_rows: int = TILE_ROWS  # rows per tile (the kernels' BM); 64 unless a launch shape asks for more

    @property
    def max_rows(self) -> int:
        return self.max_tiles * self.tile_rows


def max_tiles_for(n_pairs: int, n_experts: int, tile_rows: int = TILE_ROWS) -> int:
    """The most tiles n_pairs can fill: every used expert wastes at most tile_rows - 1 rows."""
    return (n_pairs + (tile_rows - 1) * min(n_experts, n_pairs)) // tile_rows


@triton.jit
def _count_kernel(ids, counts, n_pairs, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n_pairs
    tl.atomic_add(counts + tl.load(ids + i, mask=mask, other=0), 1, mask=mask)


@triton.jit
def _scan_kernel(counts, starts, fill, tile_expert, n_tiles, n_experts, max_tiles,
                 BLOCK_E: tl.constexpr, BLOCK_T: tl.constexpr, ROWS: tl.constexpr):
    """Every program scans the histogram (at most a few hundred experts); program 0 writes the per-expert rows."""
    e = tl.arange(0, BLOCK_E)
    tiles = (tl.load(counts + e, mask=e < n_experts, other=0) + ROWS - 1) // ROWS
    tile_end = tl.cumsum(tiles, axis=0)  # inclusive: the first tile after expert e's
    total = tl.sum(tiles, axis=0)
    if tl.program_id(0) == 0:
        first_row = (tile_end - tiles) * ROWS
        tl.store(starts + e, first_row, mask=e < n_experts)
        tl.store(fill + e, first_row, mask=e < n_experts)
        tl.store(starts + n_experts, total * ROWS)
        tl.store(n_tiles, total)
    # Tile t belongs to the expert whose tile range holds it: the number of experts ending at or before t.
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    owner = tl.sum((tile_end[None, :] <= t[:, None]).to(tl.int32), axis=1)
    tl.store(tile_expert + t, tl.where(t < total, owner, -1), mask=t < max_tiles)


@triton.jit
def _place_kernel(ids, fill, pair_row, row_token, n_pairs, top_k, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n_pairs
    row = tl.atomic_add(fill + tl.load(ids + i, mask=mask, other=0), 1, mask=mask)
    tl.store(pair_row + i, row, mask=mask)
    tl.store(row_token + row, i // top_k, mask=mask)


def group_pairs(topk_ids: torch.Tensor, n_experts: int, tile_rows: int = TILE_ROWS) -> Grouping:
    """Group the pairs of topk_ids [T, k] (expert ids in [0, n_experts)) by expert, in tiles of tile_rows rows."""
    return (group_pairs_triton if use_triton(topk_ids) else group_pairs_ref)(topk_ids, n_experts, tile_rows)


def group_pairs_triton(topk_ids: torch.Tensor, n_experts: int, tile_rows: int = TILE_ROWS) -> Grouping:
    device = topk_ids.device
    n_tokens, top_k = topk_ids.shape
    n_pairs = n_tokens * top_k
    ids = topk_ids.reshape(-1).to(torch.int32).contiguous()
    max_tiles = max_tiles_for(n_pairs, n_experts, tile_rows)
    counts = torch.zeros(n_experts, dtype=torch.int32, device=device)
    starts = torch.empty(n_experts + 1, dtype=torch.int32, device=device)
    fill = torch.empty(n_experts, dtype=torch.int32, device=device)
    pair_row = torch.empty(n_pairs, dtype=torch.int32, device=device)
    row_token = torch.full((max_tiles * tile_rows,), -1, dtype=torch.int32, device=device)
    tile_expert = torch.empty(max_tiles, dtype=torch.int32, device=device)
    n_tiles = torch.empty(1, dtype=torch.int32, device=device)
    block = 1024
    if n_pairs:
        _count_kernel[(triton.cdiv(n_pairs, block),)](ids, counts, n_pairs, BLOCK=block)
    block_t = 32
    _scan_kernel[(max(1, triton.cdiv(max_tiles, block_t)),)](
        counts, starts, fill, tile_expert, n_tiles, n_experts, max_tiles,
        BLOCK_E=triton.next_power_of_2(n_experts), BLOCK_T=block_t, ROWS=tile_rows)
    if n_pairs:
        _place_kernel[(triton.cdiv(n_pairs, block),)](ids, fill, pair_row, row_token, n_pairs, top_k, BLOCK=block)
    return Grouping(n_experts, top_k, max_tiles, counts, starts, pair_row, row_token, tile_expert, n_tiles, tile_rows)


def group_pairs_ref(topk_ids: torch.Tensor, n_experts: int, tile_rows: int = TILE_ROWS) -> Grouping:
    """The same layout with a stable sort: within an expert, pairs in their original order."""
    device = topk_ids.device
    n_tokens, top_k = topk_ids.shape
    ids = topk_ids.reshape(-1).long()
    n_pairs = ids.numel()
    max_tiles = max_tiles_for(n_pairs, n_experts, tile_rows)
    counts = torch.bincount(ids, minlength=n_experts)
    tiles = (counts + tile_rows - 1) // tile_rows
    tile_end = torch.cumsum(tiles, 0)
    first_row = (tile_end - tiles) * tile_rows
    starts = torch.cat([first_row, tile_end[-1:] * tile_rows])
    order = torch.sort(ids, stable=True).indices
    sorted_ids = ids[order]
    rank = torch.arange(n_pairs, device=device) - (torch.cumsum(counts, 0) - counts)[sorted_ids]
    pair_row = torch.empty(n_pairs, dtype=torch.long, device=device)
    pair_row[order] = first_row[sorted_ids] + rank
    row_token = torch.full((max_tiles * tile_rows,), -1, dtype=torch.int32, device=device)
    row_token[pair_row] = (torch.arange(n_pairs, device=device) // top_k).int()
    n_tiles = int(tile_end[-1]) if n_experts else 0
    tile_expert = torch.full((max_tiles,), -1, dtype=torch.int32, device=device)
    tile_expert[:n_tiles] = torch.repeat_interleave(torch.arange(n_experts, device=device), tiles).int()
    return Grouping(n_experts, top_k, max_tiles, counts.int(), starts.int(), pair_row.int(), row_token, tile_expert,
                    torch.tensor([n_tiles], dtype=torch.int32, device=device), tile_rows)
