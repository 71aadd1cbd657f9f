"""The merged cells of each block of queries without a sort (`STRATA_PA_MERGE_KERNEL=1`): two Triton passes giving
what `prompt_blocks.shared_cells` (the torch reference) gives, entry for entry.

Each query's selection is ascending and distinct. A cell is *owned* by the first query of its block that selects it.
Its merged index is the number of distinct cells below it: summed over the block's queries, the owned cells each has
below it, i.e. a binary search of the cell in that query's selection (its rank r) and the owned count before r. The
same searches give the member bits.
1. `_owned_kernel`: owned[q, i] = cell i of query q is in no earlier query of its block;
2. a cumulative sum: owned cells before each entry;
3. `_place_kernel`: every owned cell's index and bits, written into its block's row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import strata.kernels  # noqa: F401  (the interpreter switch, before Triton compiles anything)

TILE = 256  # entries of one selection per program


@triton.jit
def _search(row_ptr, n, x, LOG: tl.constexpr):
    """Rank of each `x` in the ascending `row[:n]` (entries below it) and whether it is there."""
    lo = tl.zeros_like(x)
    hi = tl.zeros_like(x) + n
    for _ in tl.static_range(LOG):  # 2^LOG > n: the interval is empty after LOG halvings
        mid = (lo + hi) // 2
        inside = mid < hi
        below = inside & (tl.load(row_ptr + mid, mask=inside, other=0) < x)
        lo = tl.where(below, mid + 1, lo)
        hi = tl.where(inside & ~below, mid, hi)
    found = (lo < n) & (tl.load(row_ptr + lo, mask=lo < n, other=0) == x)
    return lo, found


@triton.jit
def _owned_kernel(ids_ptr, width_ptr, owned_ptr, cap, BQ: tl.constexpr, TILE: tl.constexpr, LOG: tl.constexpr):
    qi = tl.program_id(0)
    i = tl.program_id(1) * TILE + tl.arange(0, TILE)
    j = qi % BQ
    first = qi - j
    block = ids_ptr + first.to(tl.int64) * cap
    live = i < tl.load(width_ptr + qi)
    x = tl.load(ids_ptr + qi.to(tl.int64) * cap + i, mask=live, other=0)
    own = live
    for k in range(0, j):  # the block's earlier queries
        _, found = _search(block + k * cap, tl.load(width_ptr + first + k), x, LOG)
        own = own & ~found
    tl.store(owned_ptr + qi.to(tl.int64) * cap + i, own.to(tl.int32), mask=i < cap)


@triton.jit
def _place_kernel(ids_ptr, width_ptr, owned_ptr, before_ptr, merged_ptr, members_ptr, n_q, cap, row_len,
                  BQ: tl.constexpr, TILE: tl.constexpr, LOG: tl.constexpr):
    qi = tl.program_id(0)
    i = tl.program_id(1) * TILE + tl.arange(0, TILE)
    j = qi % BQ
    first = qi - j
    live = i < tl.load(width_ptr + qi)
    at = qi.to(tl.int64) * cap + i
    x = tl.load(ids_ptr + at, mask=live, other=0)
    own = live & (tl.load(owned_ptr + at, mask=live, other=0) != 0)
    place = tl.load(before_ptr + at, mask=live, other=0)  # this query's owned cells below x
    bits = (tl.zeros_like(x) + 1) << j
    for jj in tl.static_range(BQ):
        q2 = first + jj
        w2 = tl.load(width_ptr + q2, mask=q2 < n_q, other=0)
        w2 = tl.where((jj != j) & (q2 < n_q), w2, 0)  # itself, or past the last query: nothing to search
        row = q2.to(tl.int64) * cap
        r, found = _search(ids_ptr + row, w2, x, LOG)
        last = row + r - 1  # owned cells of q2 in [0, r): those before entry r - 1, plus that one
        place += tl.load(before_ptr + last, mask=r > 0, other=0) + tl.load(owned_ptr + last, mask=r > 0, other=0)
        bits = bits | (found.to(tl.int32) << jj)
    out = (qi // BQ).to(tl.int64) * row_len + place
    tl.store(merged_ptr + out, x, mask=own)
    tl.store(members_ptr + out, bits, mask=own)


def merge_cells_triton(ids: torch.Tensor, width: torch.Tensor, queries: int):
    """`shared_cells` by the two passes: (cells, members [blocks, queries x cap + 1] int32, count [blocks] int32);
    entries past `count` are zeros."""
    ids, width = ids.to(torch.int32).contiguous(), width.to(torch.int32).contiguous()
    n_q, cap = ids.shape
    blocks, length = triton.cdiv(n_q, queries), queries * cap
    merged = torch.zeros(blocks, length + 1, dtype=torch.int32, device=ids.device)
    members = torch.zeros_like(merged)
    if n_q == 0 or cap == 0:
        return merged, members, torch.zeros(blocks, dtype=torch.int32, device=ids.device)
    owned = torch.empty(n_q, cap, dtype=torch.int32, device=ids.device)
    grid = (n_q, triton.cdiv(cap, TILE))
    log = max(1, cap.bit_length())
    _owned_kernel[grid](ids, width, owned, cap, BQ=queries, TILE=TILE, LOG=log)
    before = (owned.cumsum(1, dtype=torch.int32) - owned).contiguous()
    _place_kernel[grid](ids, width, owned, before, merged, members, n_q, cap, length + 1, BQ=queries, TILE=TILE,
                        LOG=log)
    per_query = torch.zeros(blocks * queries, dtype=torch.int32, device=ids.device)
    per_query[:n_q] = owned.sum(1, dtype=torch.int32)
    return merged, members, per_query.view(blocks, queries).sum(1, dtype=torch.int32)
