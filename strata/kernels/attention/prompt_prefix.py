"""Prefix blocks (config `i1`, with `q2` or more): consecutive queries whose selections are prefixes of one list share
every chunk of it, each row masked by its query's width; no merge.

Below top_k + 3 cells every query selects all cells up to itself (the identity), so in a block of consecutive queries
each selection is the first `width` entries of the block's last one: the program walks the last query's cells and a
row attends to entry j iff `j < width` of its query (a causal mask). Each K/V chunk is loaded once for the block's
queries, and with `h4` (4 queries x 4 heads of a 12-head group) the 16 rows of the MMA are all real where one query
and its group fill 12 of 16.
- Which blocks qualify is decided on the device, without a host sync (`prefix_flags`: per block, every query's width
  at most the last one's and its cells equal to the last one's first `width`): a block that does not qualify is
  skipped by the prefix launch and its queries run in a second launch of the config with one query and its whole
  group a program (`PREFIX == 2`: programs of queries in qualifying blocks skip). With `i1` that launch follows on
  the same stream; with `i2` it runs beside on a second stream (CUDA only), so the few programs of a mixed launch
  overlap the prefix programs instead of running after them.
- Bytes: a query in a block that does not qualify gets exactly the one-query config's bytes (the same kernel and
  constexprs, its programs only masked); a prefix query's rows see the same chunks at the same boundaries as one
  query a program, plus masked entries past its width; within the parity bounds (the interpreter gives equal bytes).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import strata.kernels  # noqa: F401  (the interpreter switch, before Triton compiles anything)

FLAG_TILE = 256  # selection entries compared per step


def prefix_flags_ref(ids: torch.Tensor, width: torch.Tensor, queries: int) -> torch.Tensor:
    """Torch reference of `prefix_flags`: int32 [blocks], 1 where every query of the block (of `queries` consecutive
    ones; the last block may be short) selects the first `width` cells of the block's last query's list."""
    n_q, cap = ids.shape
    blocks = triton.cdiv(n_q, queries)
    last = torch.clamp(torch.arange(blocks, device=ids.device) * queries + queries - 1, max=n_q - 1)
    own_last = last.repeat_interleave(queries)[:n_q]
    inside = torch.arange(cap, device=ids.device)[None] < width[:, None]
    same = ((ids == ids[own_last]) | ~inside).all(1) & (width <= width[own_last])
    padded = torch.ones(blocks * queries, dtype=torch.bool, device=ids.device)
    padded[:n_q] = same
    return padded.view(blocks, queries).all(1).to(torch.int32)


@triton.jit
def block_flag(ids_ptr, width_ptr, flags_ptr, blk, n_q, cap, BQ: tl.constexpr, TILE: tl.constexpr):
    """flags[blk]: 1 where block `blk` of BQ queries is a prefix block (each query's cells the first `width` of the
    last query's, its width at most the last one's)."""
    last = tl.minimum(blk * BQ + BQ - 1, n_q - 1)
    w_last = tl.load(width_ptr + last)
    last_row = ids_ptr + last.to(tl.int64) * cap
    bad = tl.zeros_like(w_last)
    for j in tl.static_range(BQ - 1):  # the last query is its own prefix
        qi = blk * BQ + j
        w = tl.load(width_ptr + qi, mask=qi < last, other=0)  # past the last query: nothing to compare
        bad += (w > w_last).to(tl.int32)
        row = ids_ptr + qi.to(tl.int64) * cap
        n = tl.where(bad == 0, tl.minimum(w, w_last), 0)
        i0 = n * 0
        while i0 < n:  # stops at the first tile that differs (a sparse selection's first, mostly)
            i = i0 + tl.arange(0, TILE)
            inside = i < n
            differ = tl.sum((tl.load(row + i, mask=inside, other=0) != tl.load(last_row + i, mask=inside, other=0))
                            .to(tl.int32), axis=0)
            bad += differ
            i0 = tl.where(differ > 0, n, i0 + TILE)
    tl.store(flags_ptr + blk, (bad == 0).to(tl.int32))


@triton.jit
def _prefix_flags_kernel(ids_ptr, width_ptr, flags_ptr, n_q, cap, BQ: tl.constexpr, TILE: tl.constexpr):
    block_flag(ids_ptr, width_ptr, flags_ptr, tl.program_id(0), n_q, cap, BQ, TILE)


def prefix_flags(ids: torch.Tensor, width: torch.Tensor, queries: int) -> torch.Tensor:
    """int32 [blocks]: 1 where the block of `queries` consecutive queries is a prefix block (`prefix_flags_ref`'s
    values); one launch, no host sync (`translate_cells` makes them in its own launch where the ids are translated
    too). `ids` int32 [n_q, cap] contiguous, `width` int32 [n_q]."""
    n_q, cap = ids.shape
    blocks = triton.cdiv(n_q, queries)
    flags = torch.empty(blocks, dtype=torch.int32, device=ids.device)
    if blocks:
        _prefix_flags_kernel[(blocks,)](ids, width, flags, n_q, cap, BQ=queries, TILE=FLAG_TILE)
    return flags


@triton.jit
def block_source(cells_ptr, members_ptr, count_ptr, blk, n_q, row_len, slot, ok, BQ: tl.constexpr,
                 PREFIX: tl.constexpr, FBQ: tl.constexpr):
    """A program's cell list: (its row, its members' row, its count, which rows are its own, each row's width).
    PREFIX 0: the block's merged list (count per block). 1: the block's last query's selection (`cells` is ids,
    `count` the widths, `members` the flags per block), nothing where the block does not qualify. 2 (one query a
    program): the query's own selection, nothing where its block of FBQ queries qualifies. A program with nothing
    runs no chunk and stores nothing (an early return would cost the chunk loop registers: sm_90 spills 32-48 B)."""
    w_row = tl.zeros_like(slot)
    if PREFIX == 1:
        last = tl.minimum(blk * BQ + BQ - 1, n_q - 1)
        live = tl.load(members_ptr + blk) != 0
        cells_row = cells_ptr + last.to(tl.int64) * row_len
        count = tl.where(live, tl.load(count_ptr + last), 0)
        ok = ok & live
        w_row = tl.load(count_ptr + blk * BQ + slot, mask=ok, other=0)
    elif PREFIX == 2:
        live = tl.load(members_ptr + blk // FBQ) == 0
        cells_row = cells_ptr + blk.to(tl.int64) * row_len
        count = tl.where(live, tl.load(count_ptr + blk), 0)
        ok = ok & live
    else:
        cells_row = cells_ptr + blk.to(tl.int64) * row_len
        count = tl.load(count_ptr + blk)
    return cells_row, members_ptr + blk.to(tl.int64) * row_len, count, ok, w_row


@triton.jit
def prefix_attend(c0, valid, w_row, CH: tl.constexpr):
    """Rows [BM, CH] attending to entries `c0 ..` of the last query's list: those below the row's query's width."""
    return ((c0 + tl.arange(0, CH))[None, :] < w_row[:, None]) & valid[None, :]
