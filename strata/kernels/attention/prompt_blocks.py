"""How the fast prompt kernels (v2, v2t, imma) cut their work: a program takes a block of queries x query heads of one
KV head as the rows of its dots, and walks the cells that block's queries select, each K/V chunk read once for all.

- Rows: row r is query `block * queries + r // heads`, head `h0 + r % heads` of its KV head's group; `queries x heads`
  rows padded to a power of two (at least 16, the MMA's M). Grid: (KV heads x head parts, query blocks).
- Shared cells: with more than one query per program the block's selections are merged into one ascending list of
  distinct cells, each with a bit per query that selects it (`shared_cells`); a row gives no weight to a cell its
  query does not select. Neighbouring queries mostly select the same cells (all of them below top_k + 3 cells, the
  recent window, the heavy blocks), so the merged list is barely longer than one selection.
- A query's result depends on its block's merged list (the chunk boundaries move with it): the same bytes for the
  same launch, within the parity bounds of any other blocking, not bitwise equal to one query per program.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from strata import switches
from strata.errors import StrataError
from strata.kernels.attention.prompt_parts import LOG2E, check_inputs, chunk_rows

MAX_QUERIES = 16  # the merge packs the query's slot in a block into 4 bits of its int32 sort key
MAX_GRID_Y = 65535
MERGE_ENTRIES = 1 << 22  # selected ids merged at a time (about 40 bytes of temporaries each)
UNUSED = (1 << 27) - 1  # above any cell (contexts stop at 2^19): marks the merge's unused entries


@dataclass(frozen=True)
class PromptConfig:
    """The tunables of a blocked prompt kernel. `heads` is an upper bound: a program takes the largest divisor of the
    KV head's group of query heads not above it (0: the whole group)."""

    queries: int = 1  # queries per program (their merged cells read once)
    heads: int = 0  # query heads per program (at most)
    chunk: int = 32  # cells per step
    warps: int = 4
    stages: int = 3  # software-pipeline depth (1: no async copies, the v2t form)

    @property
    def label(self) -> str:
        return f"q{self.queries}h{self.heads}c{self.chunk}w{self.warps}s{self.stages}"

    @classmethod
    def parse(cls, text: str, base: "PromptConfig | None" = None) -> "PromptConfig":
        """`q5h6c32w4s3`; a part left out keeps `base`'s value (default: the class defaults)."""
        m = re.fullmatch(r"(?:q(\d+))?(?:h(\d+))?(?:c(\d+))?(?:w(\d+))?(?:s(\d+))?", text)
        if not m or not text:
            raise StrataError(f"prompt-attention config {text!r}: expected the form q5h6c32w4s3")
        given = {k: int(v) for k, v in zip(("queries", "heads", "chunk", "warps", "stages"), m.groups()) if v}
        return replace(base or cls(), **given)

    @classmethod
    def chosen(cls, config: "PromptConfig | None", default: "PromptConfig") -> "PromptConfig":
        """The config a launch runs: the caller's, else `STRATA_PA_CONFIG` over the variant's default, else it."""
        if config is not None:
            return config
        text = switches.get("STRATA_PA_CONFIG")
        return cls.parse(text, default) if text else default

    def resolve(self, group: int) -> "PromptConfig":
        """This config for a KV group of `group` query heads; a clear error for one that cannot run."""
        heads = max(h for h in range(1, group + 1) if group % h == 0 and h <= (self.heads or group))
        if not 1 <= self.queries <= MAX_QUERIES:
            raise StrataError(f"prompt-attention config {self.label}: 1 to {MAX_QUERIES} queries per program")
        if self.chunk < 16 or self.chunk & (self.chunk - 1) or self.warps & (self.warps - 1) or self.stages < 1:
            raise StrataError(f"prompt-attention config {self.label}: chunk and warps powers of two (chunk >= 16), "
                              "stages >= 1")
        return replace(self, heads=heads)

    def rows(self) -> int:
        return max(16, triton.next_power_of_2(self.queries * self.heads))


def shared_cells(ids: torch.Tensor, width: torch.Tensor, queries: int):
    """The cells of each block of `queries` consecutive queries, merged: (cells [blocks, L + 1] int32, the first
    `count` ascending and distinct; members [blocks, L + 1] int32 with bit j set where the block's query j selects the
    cell; count [blocks] int32), L = queries x cap. Deterministic (a sort of int32 keys `cell * 16 + j`, integer
    sums); MERGE_ENTRIES ids at a time, which bounds the temporaries."""
    n_q, cap = ids.shape
    blocks, length = triton.cdiv(n_q, queries), queries * cap
    merged = torch.zeros(blocks, length + 1, dtype=torch.int32, device=ids.device)
    members = torch.zeros_like(merged)
    count = torch.empty(blocks, dtype=torch.int32, device=ids.device)
    step = max(1, MERGE_ENTRIES // length)
    for b0 in range(0, blocks, step):
        b1 = min(blocks, b0 + step)
        rows = slice(b0 * queries, b1 * queries)
        count[b0:b1] = _merge_into(ids[rows], width[rows], queries, merged[b0:b1], members[b0:b1])
    return merged, members, count


def _merge_into(ids, width, queries: int, merged: torch.Tensor, members: torch.Tensor) -> torch.Tensor:
    """`shared_cells` for whole blocks (the last may be short), into `merged` and `members` (zeros); returns count."""
    n_q, cap = ids.shape
    blocks, length = merged.shape[0], queries * cap
    valid = torch.arange(cap, device=ids.device)[None] < width[:, None]
    cells = torch.full((blocks * queries, cap), UNUSED, dtype=torch.int32, device=ids.device)
    cells[:n_q] = torch.where(valid, ids, UNUSED)
    slot = (torch.arange(blocks * queries, device=ids.device, dtype=torch.int32) % queries)[:, None]
    key = (cells * 16 + slot).view(blocks, length).sort(dim=1).values
    cell, slot = key >> 4, key & 15
    used = cell < UNUSED
    first = used & torch.cat([torch.ones_like(used[:, :1]), cell[:, 1:] != cell[:, :-1]], 1)
    # each entry's merged index (int64, as scatter wants); unused entries go to one extra column the kernel never reads
    index = torch.where(used, first.cumsum(1) - 1, length)
    merged.scatter_(1, index, cell)  # the entries of one cell write the same value
    members.scatter_add_(1, index, (1 << slot).to(torch.int32))
    return first.sum(1)


@triton.jit
def block_rows(block0, n_q, n_kv_heads, G: tl.constexpr, HP: tl.constexpr, BQ: tl.constexpr, BM: tl.constexpr):
    """This program's block, KV head, and per row: the query's slot in the block, its flat head index into q
    [n_q * H] (int64), and whether the row is real."""
    part = tl.program_id(0)  # fastest: the programs reading one block's cells run side by side (L2 hits)
    blk = tl.program_id(1) + block0
    kvh = part // (G // HP)
    r = tl.arange(0, BM)
    slot = r // HP
    query = blk * BQ + slot
    ok = (r < BQ * HP) & (query < n_q)
    head = (query.to(tl.int64) * n_kv_heads + kvh) * G + (part % (G // HP)) * HP + r % HP
    return blk, kvh, slot, head, ok


@triton.jit
def block_chunk(cells_row, members_row, page_table_ptr, c0, count, kvh, n_kv_heads, slot, CH: tl.constexpr,
                BQ: tl.constexpr):
    """Pool rows of merged cells `c0 .. c0 + CH`, which exist, and which rows [BM, CH] attend to each."""
    rows, valid = chunk_rows(cells_row, page_table_ptr, c0, count, kvh, n_kv_heads, CH)
    if BQ == 1:
        attend = valid[None, :] & (slot[:, None] == 0)
    else:
        bits = tl.load(members_row + c0 + tl.arange(0, CH), mask=valid, other=0)
        attend = ((bits[None, :] >> slot[:, None]) & 1) != 0
    return rows, valid, attend


def launch_blocked(kernel, q, pool, page_table, ids, width, sm_scale: float | None, config: PromptConfig,
                   **meta) -> torch.Tensor:
    """The host side of the blocked kernels: check, merge the blocks' selections (more than one query per program),
    launch `kernel` over (KV heads x head parts, query blocks); `meta` carries the variant's own constexprs."""
    n_q, n_heads, dim, group = check_inputs(q, pool, ids, width, need_int8=True)
    config = config.resolve(group)
    if n_q < config.queries:  # a lone query's merged cells are its own: skip the merge
        config = replace(config, queries=max(1, n_q))
    scale = dim ** -0.5 if sm_scale is None else sm_scale
    out = torch.empty(n_q, n_heads, dim, dtype=torch.float32, device=q.device)
    if n_q == 0:
        return out
    ids, width = ids.to(torch.int32).contiguous(), width.to(torch.int32).contiguous()
    if config.queries == 1:
        cells, members, count = ids, ids, width  # members unused
    elif q.is_cuda and switches.get("STRATA_PA_MERGE_KERNEL"):
        from strata.kernels.attention.merge_cells import merge_cells_triton

        cells, members, count = merge_cells_triton(ids, width, config.queries)
    else:
        cells, members, count = shared_cells(ids, width, config.queries)
    parts, blocks = pool.n_kv_heads * (group // config.heads), count.shape[0]
    args = (q.float().contiguous(), out, cells, members, count, page_table.to(torch.int32).contiguous(), pool.k, pool.v,
            pool.k_scale, pool.v_scale)
    for block0 in range(0, blocks, MAX_GRID_Y):  # a grid's second dimension stops at 65,535
        kernel[(parts, min(MAX_GRID_Y, blocks - block0))](
            *args, block0, n_q, cells.shape[1], pool.n_kv_heads, scale * LOG2E, G=group, HP=config.heads,
            BQ=config.queries, BM=config.rows(), CH=config.chunk, num_warps=config.warps, num_stages=config.stages,
            **meta)
    return out
