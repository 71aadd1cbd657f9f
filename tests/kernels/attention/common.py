"""Synthetic pools, queries and selections for the attention tests (the parity tool's data at small sizes)."""

import torch

from strata.kernels.attention.paged import PagedKV
from tests.kernels import DEVICE


def random_pool(n_cells: int, n_kv_heads: int, dim: int, int8: bool = True, seed: int = 0):
    """A pool holding `n_cells` cells behind a shuffled page table: int8 codes U[-127, 127] with fp16 scales
    U[0.005, 0.03], or fp16 K ~ N(0, 1.5^2), V ~ N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    n_pages = (n_cells + 3) // 4
    pool = PagedKV.empty(n_pages, n_kv_heads, dim, int8=int8)
    rows = pool.k.shape[0]
    if int8:
        pool.k.copy_(torch.randint(-127, 128, (rows, dim), generator=g))
        pool.v.copy_(torch.randint(-127, 128, (rows, dim), generator=g))
        pool.k_scale.copy_(torch.rand(rows, dim // 64, generator=g) * 0.025 + 0.005)
        pool.v_scale.copy_(torch.rand(rows, dim // 64, generator=g) * 0.025 + 0.005)
    else:
        pool.k.copy_(torch.randn(rows, dim, generator=g) * 1.5)
        pool.v.copy_(torch.randn(rows, dim, generator=g))
    table = torch.randperm(n_pages, generator=g).int()
    moved = PagedKV(*(None if t is None else t.to(DEVICE) for t in (pool.k, pool.v, pool.k_scale, pool.v_scale)),
                    n_kv_heads)
    return moved, table.to(DEVICE)


def selections(positions: list[int], cap: int, seed: int = 0):
    """Per query at `pos`: every cell 0..pos if they fit in `cap`, else the newest cap/2 plus random older ones."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.full((len(positions), cap), -1, dtype=torch.int32)
    width = torch.zeros(len(positions), dtype=torch.int32)
    for i, pos in enumerate(positions):
        n_kv = pos + 1
        if n_kv <= cap:
            chosen = torch.arange(n_kv)
        else:
            recent = torch.arange(n_kv - cap // 2, n_kv)
            older = torch.randperm(n_kv - cap // 2, generator=g)[: cap - cap // 2]
            chosen = torch.cat([older, recent]).sort().values
        ids[i, : len(chosen)] = chosen.int()
        width[i] = len(chosen)
    return ids.to(DEVICE), width.to(DEVICE)


def queries(n_q: int, n_heads: int, dim: int, seed: int = 0) -> torch.Tensor:
    return (torch.randn(n_q, n_heads, dim, generator=torch.Generator().manual_seed(seed)) * 2).to(DEVICE)
