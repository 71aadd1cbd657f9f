"""QSA top-k: per query, the `width = min(n_kv, top_k + 3)` best cells, ties to the lowest index, emitted ascending.

A cell's score is its block's (`block_scores`). The reference is the per-cell recipe of the spec (a stable sort of
-score over the cells in view, the first `width`, sorted ascending). The Triton kernel ranks blocks weighted by their
cell counts: a 4 x 8-bit radix select finds the largest key `thr` with `#cells(key >= thr) >= width`, then it emits
all cells of blocks above `thr` and the lowest-index cells at `thr` until `width`: the same ids, bit for bit.
Keys order floats (-0 as +0, NaN below everything). `ids` rows are padded with -1 past `width`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import strata.kernels  # noqa: F401  (the interpreter switch, before Triton compiles anything)

TOP_K = 2048
QUERY_CHUNK_CELLS = 1 << 24  # elements per sort in the reference


def select_cells_ref(scores: torch.Tensor, n_kv: torch.Tensor, top_k: int = TOP_K) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [n_q, top_k + 3] int32, width [n_q] int32) from block scores [n_q, >= ceil(n_kv / 4)]."""
    cap = top_k + 3
    n_q, n_cols = scores.shape
    n_kv = n_kv.long().to(scores.device)
    width = n_kv.clamp(max=cap)
    ids = torch.full((n_q, cap), -1, dtype=torch.int32, device=scores.device)
    n_cells = min(4 * n_cols, int(n_kv.max()) if n_q else 0)
    step = max(1, QUERY_CHUNK_CELLS // max(n_cells, 1))
    for q0 in range(0, n_q, step):
        cell_scores = scores[q0 : q0 + step].repeat_interleave(4, 1)[:, :n_cells]
        in_view = torch.arange(n_cells, device=scores.device)[None] < n_kv[q0 : q0 + step, None]
        order = torch.sort(-cell_scores, dim=1, stable=True).indices
        order = order.gather(1, torch.sort((~in_view).gather(1, order).byte(), dim=1, stable=True).indices)
        take = order[:, :cap]
        keep = torch.arange(take.shape[1], device=scores.device)[None] < width[q0 : q0 + step, None]
        chosen = torch.sort(torch.where(keep, take, n_cells), dim=1).values
        ids[q0 : q0 + step, : take.shape[1]] = torch.where(keep, chosen, -1).int()
    return ids, width.int()


@triton.jit
def _order_key(x):
    """Floats as int64 keys in [0, 2^32) that order like the floats: -0 as +0, NaN lowest."""
    bits = x.to(tl.int32, bitcast=True)
    bits = tl.where(bits == -2147483648, 0, bits)
    key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    key = tl.where(x != x, -2147483648, key)
    return key.to(tl.int64) + 2147483648


@triton.jit
def _select_kernel(scores_ptr, n_kv_ptr, ids_ptr, width_ptr, stride, cap, TILE: tl.constexpr):
    qi = tl.program_id(0)
    row = scores_ptr + qi.to(tl.int64) * stride
    out = ids_ptr + qi.to(tl.int64) * cap
    n_kv = tl.load(n_kv_ptr + qi)
    width = tl.minimum(n_kv, cap)
    tl.store(width_ptr + qi, width)
    lanes = tl.arange(0, TILE)
    for j0 in range(0, cap, TILE):
        j = j0 + lanes
        tl.store(out + j, tl.where(j < n_kv, j, -1), mask=(j < cap) & ((n_kv <= cap) | (j >= width)))
    if n_kv > cap:
        n_bid = n_kv // 4
        tail = n_kv - 4 * n_bid  # cells of the unfinished block n_bid
        tail_key = _order_key(tl.load(row + n_bid, mask=tail > 0, other=0.0))
        bins = tl.arange(0, 256)
        prefix = tl.zeros((), tl.int64)
        above = tl.zeros((), tl.int32)  # cells whose key is above every key with this prefix
        for p in tl.static_range(4):
            shift = 24 - 8 * p  # constexpr: p is a static_range index
            hist = tl.zeros((256,), tl.int32)
            for b0 in range(0, n_bid, TILE):
                b = b0 + lanes
                key = _order_key(tl.load(row + b, mask=b < n_bid, other=0.0))
                match = (b < n_bid) & ((key >> (shift + 8)) == prefix)
                hist += tl.histogram(((key >> shift) & 255).to(tl.int32), 256, mask=match)
            hist = hist * 4
            tail_match = (tail > 0) & ((tail_key >> (shift + 8)) == prefix)
            hist += tl.where(tail_match & (bins == ((tail_key >> shift) & 255)), tail, 0)
            reach = tl.cumsum(hist, 0, reverse=True)  # cells at this digit or above, within the prefix
            digit = tl.sum((above + reach >= width).to(tl.int32), 0) - 1
            above += tl.sum(tl.where(bins > digit, hist, 0), 0)
            prefix = prefix * 256 + digit
        need = width - above  # cells to take at key == prefix, lowest index first
        n_blocks = n_bid + (tail > 0)
        written = tl.zeros((), tl.int32)
        seen = tl.zeros((), tl.int32)
        sub = tl.arange(0, 4)
        for b0 in range(0, n_blocks, TILE):
            b = b0 + lanes
            live = b < n_blocks
            key = _order_key(tl.load(row + b, mask=live, other=0.0))
            cells = tl.where(b < n_bid, 4, tail)
            at = tl.where(live & (key == prefix), cells, 0)
            before = seen + tl.cumsum(at, 0) - at
            take = tl.where(live & (key > prefix), cells, tl.minimum(tl.maximum(need - before, 0), at))
            pos = written + tl.cumsum(take, 0) - take
            cell = b[:, None] * 4 + sub[None, :]
            tl.store(out + pos[:, None] + sub[None, :], cell, mask=sub[None, :] < take[:, None])
            written += tl.sum(take, 0)
            seen += tl.sum(at, 0)


def select_cells_triton(scores: torch.Tensor, n_kv: torch.Tensor, top_k: int = TOP_K,
                        tile: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """`select_cells_ref` as one Triton launch (one program per query, `tile` blocks per step)."""
    n_q = scores.shape[0]
    cap = top_k + 3
    ids = torch.empty(n_q, cap, dtype=torch.int32, device=scores.device)
    width = torch.empty(n_q, dtype=torch.int32, device=scores.device)
    scores = scores.float().contiguous()
    _select_kernel[(n_q,)](scores, n_kv.to(torch.int32).contiguous(), ids, width, scores.stride(0), cap,
                           TILE=tile, num_warps=8)
    return ids, width


def select_cells(scores: torch.Tensor, n_kv: torch.Tensor, top_k: int = TOP_K) -> tuple[torch.Tensor, torch.Tensor]:
    """Selected cells: the Triton kernel on the GPU, the reference on the CPU."""
    return (select_cells_triton if scores.is_cuda else select_cells_ref)(scores, n_kv, top_k)
