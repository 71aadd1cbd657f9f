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
- Split-K (`k2` ..): a third grid axis cuts each block's cell list into whole chunks, each program writes its unscaled
  acc, m and l, and the decode merge (`merge_splits`) joins them in split order: more programs where few queries
  leave SMs idle; within the parity bounds, not the bytes of one split.
- `t1`: the cells are resolved through the page table on the host side first (`translate_cells`), so a chunk's rows
  wait on one load (the ids) instead of two; the same rows in the same order, the same bytes. Why it may matter:
  Triton's pipeliner leaves a load unpipelined when it is `stages - 1` or more indirections from a dot, so at 3 stages
  the ids (ids -> page -> K) are loaded synchronously every step; with t1 (ids -> K) every load is pipelined.
- `t2`: as t1, the cells resolved to KV head 0's pool rows and the kernel's row offsets in int32 (a pool under 2 GiB
  of codes, else t1): far fewer integer ops per gathered row; the same rows, the same bytes.
- `f1`: the next chunk's ids (and through the page table, its rows) load during this chunk, carried by the loop;
  the same bytes. Meant for one stage (v2t, no async copies); with the pipeliner these loads no longer reach a dot
  through the loop body, so it stops prefetching them (the sweep says which wins).
- `r128`: the compiler's `maxnreg`, registers per thread: fewer registers, more programs resident per SM.
- `x1`: int8 codes become fp16 through their bits (`0x6480 + c` read as fp16 is 1152 + c: an int16 add and a half
  subtract) instead of the int-to-float conversion, which runs at a quarter of the rate; exact, so the same bytes.
  v2's K and V, imma's fp16 P.V (`p16`). `x2`: also V converted before it is staged for the dot (fp16 V read by
  ldmatrix.trans instead of a byte load per code; more shared memory, fewer registers); the same bytes.
- `g1` (imma): the scores as one 2D dot per 64-dim group, the warps splitting the cells (prompt_imma_cells.py): no
  cross-warp sum of the groups' partials. Other summation orders: within the parity bounds, not imma's bytes. `n2`
  (with g1): q in two byte parts (16 bits) instead of three, a third fewer score dots; not exact, measured. `d2` (v2,
  imma p16): the fp16 P.V as two dots over 32 dims each, half the dot result live at a time (fewer registers); the
  same bytes. `e1`/`e2` (imma g1): the K (and V) scales through one-hot dots, so the pipeliner copies them ahead; the
  same bytes. `u1` (imma g1 p16): p normalized by the pool's largest V scale, not each chunk's: no cross-warp max of
  the chunk's V scales and no accumulator rescale a chunk; within the parity bounds, not the same bytes. `a1` (with
  u1): the next chunk's K and V scales loaded during this one, carried by the loop (the pipeliner copies ahead only
  loads that feed a dot); u1's bytes. `o1` (with u1): the V codes read as 16-bit words (a 16-bit dot operand reaches
  the MMA through ldmatrix.trans; int8 codes took a byte load each) and split into the even and odd dims by bitwise
  ops, two dots over 32 dims; u1's bytes interpreted (on the H200 within 1e-5 of the output scale: the dots
  sum in another order). `v1` (with u1): p made in the scores' layout, each group's V
  scales loaded as a column as the K scales are, then moved into P.V's layout as one tensor; u1's bytes interpreted (the H200: as o1).
- `i1`, `i2` (imma g1, q2 or more): prefix blocks, no merge (prompt_prefix.py); the queries of blocks that do not
  qualify run the one-query config (`i2`: on a second stream beside the prefix launch), its bytes. `z1`: the blocks
  launched last first; the same bytes. `y4`: splits added while the launch has fewer than 4 programs an SM
  (`spread_splits`, from the shapes alone); where it adds none, the bytes of k.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from strata import switches
from strata.errors import StrataError
from strata.kernels.attention.prompt_parts import LOG2E, check_inputs, chunk_rows
from strata.kernels.attention.prompt_prefix import FLAG_TILE, block_flag, prefix_flags

MAX_QUERIES = 16  # the merge packs the query's slot in a block into 4 bits of its int32 sort key
MAX_GRID_Y = 65535
MAX_SPLITS = 64
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
    splits: int = 1  # programs per block's cell list (split-K; their partial results merged by a second launch)
    translate: int = 0  # 1: cell ids resolved through the page table before the launch (one dependent load less)
    prefetch: int = 0  # 1: each step loads the next chunk's ids and rows (a loop-carried prefetch, by hand)
    pv: int = 0  # the P.V operands: 0 the variant's own, 16 fp16 hi + lo (v2's form, in imma)
    maxreg: int = 0  # registers per thread the compiler may use (0: its choice); fewer lets more programs share an SM
    exact: int = 0  # 1: int8 codes to fp16 through their bits (full-rate integer and half adds), the same values
    scores: int = 0  # imma's q . k: 0 batched over the 64-dim groups (a warp each), 1 a 2D dot per group (warps: cells)
    qparts: int = 0  # imma g1: 2 q in two byte parts (16 bits) instead of three (0: three, exact to 24 bits)
    halves: int = 0  # fp16 P.V (v2, imma p16): 2 as two dots over 32 dims each (half the dot result live: fewer registers)
    early: int = 0  # imma g1: 1 K scales through a one-hot dot (copied ahead with K, not loaded in the loop), 2 V's too
    uniform: int = 0  # imma g1 p16: 1 p normalized by the pool's largest V scale, not each chunk's (no cross-warp max)
    ahead: int = 0  # imma u1: 1 the next chunk's K and V scales loaded during this one (carried by the loop)
    pairs: int = 0  # imma u1: 1 V codes read as 16-bit words, split into even and odd dims (ldmatrix, not byte loads)
    vside: int = 0  # imma u1: 1 p made in the scores' layout (each group's V scales as a column), one layout change
    prefix: int = 0  # imma g1, q2+: 1 prefix blocks (prompt_prefix.py), the rest a second launch; 2 that one beside
    order: int = 0  # 1: blocks launched last first (the widest first where widths grow with the position)
    spread: int = 0  # programs an SM wanted: splits added (`spread_splits`) where the blocks give fewer (0: k alone)

    @property
    def label(self) -> str:
        extra = {"k": self.splits - 1 and self.splits, "t": self.translate, "f": self.prefetch,
                 "p": self.pv, "r": self.maxreg, "x": self.exact, "g": self.scores, "n": self.qparts,
                 "d": self.halves, "e": self.early, "u": self.uniform,
                 "a": self.ahead, "o": self.pairs, "v": self.vside, "i": self.prefix, "z": self.order,
                 "y": self.spread}
        return (f"q{self.queries}h{self.heads}c{self.chunk}w{self.warps}s{self.stages}"
                + "".join(f"{key}{value}" for key, value in extra.items() if value))

    @classmethod
    def parse(cls, text: str, base: "PromptConfig | None" = None) -> "PromptConfig":
        """`q5h6c32w4s3` (then optionally `k2`, `t1`, `f1`, `p16`, `r128`, `x1`, `g1`, `n2`, `d2`, `e1`, `u1`, `a1`,
        `o1`, `v1`, `i1`, `z1`, `y4`);
        left out keeps `base`'s value (default: the class defaults)."""
        m = re.fullmatch(r"(?:q(\d+))?(?:h(\d+))?(?:c(\d+))?(?:w(\d+))?(?:s(\d+))?(?:k(\d+))?(?:t(\d+))?(?:f(\d+))?"
                         r"(?:p(\d+))?(?:r(\d+))?(?:x(\d+))?(?:g(\d+))?(?:n(\d+))?(?:d(\d+))?(?:e(\d+))?"
                         r"(?:u(\d+))?(?:a(\d+))?(?:o(\d+))?(?:v(\d+))?(?:i(\d+))?(?:z(\d+))?"
                         r"(?:y(\d+))?", text)
        if not m or not text:
            raise StrataError(f"prompt-attention config {text!r}: expected the form q5h6c32w4s3 "
                              "(then k2, t1, f1, p16, r128, x1, g1, n2, d2, e1, u1, a1, o1, v1, i1, z1, y4)")
        given = {k: int(v) for k, v in zip(FIELDS, m.groups()) if v}
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
        if not 1 <= self.splits <= MAX_SPLITS or self.translate not in (0, 1, 2) or self.prefetch not in (0, 1) \
                or self.pv not in (0, 16):
            raise StrataError(f"prompt-attention config {self.label}: k 1 to {MAX_SPLITS}, t 0 to 2, f 0 or 1, "
                              "p 0 or 16")
        if self.maxreg and not 24 <= self.maxreg <= 255:
            raise StrataError(f"prompt-attention config {self.label}: r 24 to 255 registers")
        if self.exact not in (0, 1, 2) or self.scores not in (0, 1) or self.qparts not in (0, 2) \
                or self.halves not in (0, 2) or self.early not in (0, 1, 2):
            raise StrataError(f"prompt-attention config {self.label}: x and e 0 to 2, g 0 or 1, n and d 2")
        if any(x not in (0, 1) for x in (self.uniform, self.ahead, self.pairs, self.vside)):
            raise StrataError(f"prompt-attention config {self.label}: u, a, o and v 0 or 1")
        if self.prefix not in (0, 1, 2) or self.order not in (0, 1) or self.spread > 32:
            raise StrataError(f"prompt-attention config {self.label}: i 0 to 2, z 0 or 1, y 0 to 32")
        return replace(self, heads=heads)

    def rows(self) -> int:
        return max(16, triton.next_power_of_2(self.queries * self.heads))


FIELDS = ("queries", "heads", "chunk", "warps", "stages", "splits", "translate", "prefetch", "pv", "maxreg", "exact",
          "scores", "qparts", "halves", "early", "uniform", "ahead", "pairs", "vside", "prefix", "order",
          "spread")


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
def block_rows(block0, n_q, n_kv_heads, G: tl.constexpr, HP: tl.constexpr, BQ: tl.constexpr, BM: tl.constexpr,
               REVERSE: tl.constexpr = False):
    """This program's block, KV head, and per row: the query's slot in the block, its flat head index into q
    [n_q * H] (int64), and whether the row is real. REVERSE (`z1`): the last block first."""
    part = tl.program_id(0)  # fastest: the programs reading one block's cells run side by side (L2 hits)
    blk = tl.program_id(1) + block0
    if REVERSE:  # the widest blocks (the latest queries) start first: no long program is left to run alone at the end
        blk = tl.cdiv(n_q, BQ) - 1 - blk
    kvh = part // (G // HP)
    r = tl.arange(0, BM)
    slot = r // HP
    query = blk * BQ + slot
    ok = (r < BQ * HP) & (query < n_q)
    head = (query.to(tl.int64) * n_kv_heads + kvh) * G + (part % (G // HP)) * HP + r % HP
    return blk, kvh, slot, head, ok


@triton.jit
def block_chunk(cells_row, members_row, page_table_ptr, c0, count, kvh, n_kv_heads, slot, CH: tl.constexpr,
                BQ: tl.constexpr, TRANSLATED: tl.constexpr = False):
    """Pool rows of merged cells `c0 .. c0 + CH`, which exist, and which rows [BM, CH] attend to each."""
    rows, valid = cell_rows(cells_row, page_table_ptr, c0, count, kvh, n_kv_heads, CH, TRANSLATED)
    return rows, valid, cell_attend(members_row, c0, valid, slot, CH, BQ)


@triton.jit
def cell_rows(cells_row, page_table_ptr, c0, count, kvh, n_kv_heads, CH: tl.constexpr, TRANSLATED: tl.constexpr):
    """Pool rows (int64) of merged cells `c0 .. c0 + CH` and which exist. TRANSLATED: the cells are already physical
    (`page * 4 + cell % 4`, `translate_cells`), no page-table load; 2: they are KV head 0's pool rows, and the rows are
    int32 (the caller checked that every byte offset fits): two integer ops a cell instead of about twelve."""
    if TRANSLATED == 2:
        j = c0 + tl.arange(0, CH)
        valid = j < count
        rows = tl.load(cells_row + j, mask=valid, other=0) + kvh * 4
    elif TRANSLATED:
        j = c0 + tl.arange(0, CH)
        valid = j < count
        cell = tl.load(cells_row + j, mask=valid, other=0).to(tl.int64)
        rows = ((cell >> 2) * n_kv_heads + kvh) * 4 + (cell & 3)
    else:
        rows, valid = chunk_rows(cells_row, page_table_ptr, c0, count, kvh, n_kv_heads, CH)
    return rows, valid


@triton.jit
def cell_attend(members_row, c0, valid, slot, CH: tl.constexpr, BQ: tl.constexpr):
    """Which rows [BM, CH] attend to each cell of the chunk: a row's query's bit in the cell's members."""
    if BQ == 1:
        attend = valid[None, :] & (slot[:, None] == 0)
    else:
        bits = tl.load(members_row + c0 + tl.arange(0, CH), mask=valid, other=0)
        attend = ((bits[None, :] >> slot[:, None]) & 1) != 0
    return attend


@triton.jit
def split_range(count, CH: tl.constexpr, SPLITS: tl.constexpr):
    """The cells `lo .. hi` this program walks: all of them, or its share of whole chunks (split-K, axis 2)."""
    if SPLITS == 1:
        return 0, count
    per = tl.cdiv(tl.cdiv(count, CH), SPLITS) * CH
    lo = tl.program_id(2) * per
    return lo, tl.minimum(count, lo + per)


@triton.jit
def block_store(out_ptr, parts_ptr, ml_ptr, acc, m, l, head, ok, NG: tl.constexpr, SPLITS: tl.constexpr):
    """The program's result: acc / l into out [n_q * H, D]; with splits, acc, m and l unscaled into the split's
    partials (parts [n_q * H, SPLITS, D], ml [n_q * H, SPLITS, 2]) for `merge_splits`."""
    D: tl.constexpr = NG * 64
    g = tl.arange(0, NG)[:, None, None]
    d = tl.arange(0, 64)[None, None, :]
    if SPLITS == 1:
        out = tl.where(l[None, :, None] > 0, acc / l[None, :, None], 0.0)
        tl.store(out_ptr + head[None, :, None] * D + g * 64 + d, out, mask=ok[None, :, None])
    else:
        part = head * SPLITS + tl.program_id(2)
        tl.store(parts_ptr + part[None, :, None] * D + g * 64 + d, acc, mask=ok[None, :, None])
        tl.store(ml_ptr + part * 2, m, mask=ok)
        tl.store(ml_ptr + part * 2 + 1, l, mask=ok)


_LAST = {}  # the last launch's compiled kernel, for `last_resources`


def last_resources() -> tuple[int, int, int, int] | None:
    """(registers per thread, spilled registers, shared memory bytes, warps) of the last blocked launch's compiled
    kernel; None under the interpreter. The sweep prints them: what limits the programs resident per SM."""
    compiled = _LAST.get("kernel")
    if compiled is None or not hasattr(compiled, "n_regs"):
        return None
    return compiled.n_regs, compiled.n_spills, compiled.metadata.shared, compiled.metadata.num_warps


def translate_cells(cells: torch.Tensor, page_table: torch.Tensor, n_kv_heads: int = 1, width=None,
                    queries: int = 0):
    """Logical cells -> physical ones (`page_table[cell // 4] * 4 + cell % 4`), int32, same shape; with `n_kv_heads`
    (t2) the pool rows of KV head 0 (`page_table[cell // 4] * 4 * n_kv_heads + cell % 4`: KV head h's row is 4 h
    further). Entries outside the table (padding) become 0, which no kernel reads. One launch (torch's ops would take
    about six). With `queries` (and the selections' `width`): (translated, `prefix_flags` of the untranslated cells),
    both from the one launch."""
    cells = cells.contiguous()
    out = torch.empty(cells.shape, dtype=torch.int32, device=cells.device)
    n = cells.numel()
    tiles = triton.cdiv(n, TRANSLATE_BLOCK)
    if not queries:
        if n:
            _translate_kernel[(tiles,)](cells, page_table, out, n, 4 * page_table.shape[0], 4 * n_kv_heads,
                                        BLOCK=TRANSLATE_BLOCK)
        return out
    blocks = triton.cdiv(cells.shape[0], queries)
    flags = torch.empty(blocks, dtype=torch.int32, device=cells.device)
    if tiles + blocks:
        _translate_kernel[(tiles + blocks,)](cells, page_table, out, n, 4 * page_table.shape[0], 4 * n_kv_heads,
                                             BLOCK=TRANSLATE_BLOCK, width_ptr=width, flags_ptr=flags,
                                             n_q=cells.shape[0], cap=cells.shape[1], tiles=tiles, BQ=queries,
                                             TILE=FLAG_TILE)
    return out, flags


TRANSLATE_BLOCK = 1024


@triton.jit
def _translate_kernel(cells_ptr, table_ptr, out_ptr, n, n_cells, page_rows, BLOCK: tl.constexpr, width_ptr=None,
                      flags_ptr=None, n_q=0, cap=0, tiles=0, BQ: tl.constexpr = 0, TILE: tl.constexpr = 1):
    # BQ > 0: the programs past the translation's tiles make the prefix flags of blocks of BQ queries (`block_flag`)
    if BQ == 0:
        _translate_tile(cells_ptr, table_ptr, out_ptr, tl.program_id(0), n, n_cells, page_rows, BLOCK)
    elif tl.program_id(0) < tiles:
        _translate_tile(cells_ptr, table_ptr, out_ptr, tl.program_id(0), n, n_cells, page_rows, BLOCK)
    else:
        block_flag(cells_ptr, width_ptr, flags_ptr, tl.program_id(0) - tiles, n_q, cap, BQ, TILE)


@triton.jit
def _translate_tile(cells_ptr, table_ptr, out_ptr, tile, n, n_cells, page_rows, BLOCK: tl.constexpr):
    i = tile.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = i < n
    cell = tl.load(cells_ptr + i, mask=live, other=0)
    inside = (cell >= 0) & (cell < n_cells)
    cell = tl.where(inside, cell, 0)
    page = tl.load(table_ptr + cell // 4, mask=live & inside, other=0)
    tl.store(out_ptr + i, tl.where(inside, page * page_rows + cell % 4, 0), mask=live)


def launch_blocked(kernel, q, pool, page_table, ids, width, sm_scale: float | None, config: PromptConfig,
                   **meta) -> torch.Tensor:
    """The host side of the blocked kernels: check, merge the blocks' selections (more than one query per program),
    launch `kernel` over (KV heads x head parts, query blocks, splits) and merge the splits; `meta` carries the
    variant's own constexprs. Prefix blocks (`i1`, `i2`): no merge; the prefix launch, then the one-query launch
    for the queries of blocks that do not qualify (prompt_prefix.py)."""
    from strata.kernels.attention.decode import merge_splits

    n_q, n_heads, dim, group = check_inputs(q, pool, ids, width, need_int8=True)
    config = config.resolve(group)
    if n_q < config.queries:  # a lone query's merged cells are its own: skip the merge
        config = replace(config, queries=max(1, n_q))
    if config.queries == 1 and config.prefix:  # one query a program: its own list already
        config = replace(config, prefix=0)
    blocks = triton.cdiv(n_q, config.queries)
    config = replace(config, splits=spread_splits(config, pool.n_kv_heads * (group // config.heads) * blocks,
                                                  ids.shape[1], q.device))
    scale = dim ** -0.5 if sm_scale is None else sm_scale
    out = torch.empty(n_q, n_heads, dim, dtype=torch.float32, device=q.device)
    if n_q == 0:
        return out
    ids, width = ids.to(torch.int32).contiguous(), width.to(torch.int32).contiguous()
    page_table = page_table.to(torch.int32).contiguous()
    if config.translate == 2 and pool.k.numel() >= 2**31:  # t2's int32 offsets would overflow: t1's rows (the same)
        config = replace(config, translate=1)
    page_rows = pool.n_kv_heads if config.translate == 2 else 1
    if config.prefix and config.translate:  # the blocks' flags stand where the members would (no merge)
        (cells, members), count = translate_cells(ids, page_table, page_rows, width, config.queries), width
    elif config.prefix:
        cells, members, count = ids, prefix_flags(ids, width, config.queries), width
    elif config.queries == 1:
        cells, members, count = ids, ids, width  # members unused
    elif q.is_cuda and switches.get("STRATA_PA_MERGE_KERNEL"):
        from strata.kernels.attention.merge_cells import merge_cells_triton

        cells, members, count = merge_cells_triton(ids, width, config.queries)
    else:
        cells, members, count = shared_cells(ids, width, config.queries)
    if config.translate and not config.prefix:
        cells = translate_cells(cells, page_table, page_rows)
    splits = config.splits
    parts = ml = out  # unused with one split
    if splits > 1:
        parts = torch.empty(n_q * n_heads, splits, dim, dtype=torch.float32, device=q.device)
        ml = torch.empty(n_q * n_heads, splits, 2, dtype=torch.float32, device=q.device)
    args = (q.float().contiguous(), out, parts, ml, cells, members, count, page_table, pool.k, pool.v, pool.k_scale,
            pool.v_scale)
    launch = _Launch(kernel, args, n_q, cells.shape[1], pool.n_kv_heads, scale * LOG2E, group, meta)
    if not config.prefix:
        launch(config, blocks)
    else:
        rest = replace(config, queries=1, heads=0, prefix=0).resolve(group)  # the one-query form, its own bytes
        if config.prefix == 2 and q.is_cuda:
            _beside(lambda: launch(rest, n_q, PREFIX=2, FBQ=config.queries),
                    lambda: launch(config, blocks, PREFIX=1), q.device)
        else:
            launch(config, blocks, PREFIX=1)
            launch(rest, n_q, PREFIX=2, FBQ=config.queries)
    if splits > 1:
        merge_splits(parts, ml, out.view(n_q * n_heads, dim))
    return out


SPREAD_SMS = 132  # `spread_splits`' SM count off the GPU (the H200's): the interpreter's tests see the device's choice
SPLIT_CHUNKS = 8  # the fewest chunks of a full selection a split gets from `y`


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def spread_splits(config: PromptConfig, programs: int, cap: int, device: torch.device) -> int:
    """The splits a launch of `programs` programs (KV heads x head parts x blocks) runs with: with `y` (spread) at
    least enough for y programs an SM, as long as each split keeps SPLIT_CHUNKS chunks of a `cap`-cell selection;
    never fewer than k. Shapes only (no host sync): few queries x KV heads leave SMs idle or a last partial wave, and
    a long context's launch already has programs enough (k stays, and its bytes)."""
    if not config.spread:
        return config.splits
    device = torch.device(device)
    sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device()) \
        if device.type == "cuda" else SPREAD_SMS
    want = -(-config.spread * sms // max(1, programs))
    return max(config.splits, min(want, max(1, cap // (config.chunk * SPLIT_CHUNKS)), MAX_SPLITS))


class _Launch:
    """One blocked launch of `kernel` over (KV heads x head parts, blocks, splits) for a config, in grids of at most
    MAX_GRID_Y blocks; the extra constexprs (PREFIX, FBQ, REVERSE) are passed only when set, so a launch without them
    is exactly the launch before they existed."""

    def __init__(self, kernel, args, n_q, row_len, n_kv_heads, scale_log2, group, meta):
        self.kernel, self.args, self.n_q, self.row_len = kernel, args, n_q, row_len
        self.n_kv_heads, self.scale_log2, self.group, self.meta = n_kv_heads, scale_log2, group, meta

    def __call__(self, config: PromptConfig, blocks: int, **extra) -> None:
        programs = self.n_kv_heads * (self.group // config.heads)
        options = {"maxnreg": config.maxreg} if config.maxreg else {}  # unset: the launch exactly as before
        if config.order:
            options["REVERSE"] = True
        for block0 in range(0, blocks, MAX_GRID_Y):  # a grid's second dimension stops at 65,535
            _LAST["kernel"] = self.kernel[(programs, min(MAX_GRID_Y, blocks - block0), config.splits)](
                *self.args, block0, self.n_q, self.row_len, self.n_kv_heads, self.scale_log2, G=self.group,
                HP=config.heads, BQ=config.queries, BM=config.rows(), CH=config.chunk, SPLITS=config.splits,
                TRANSLATED=2 if config.translate == 2 else bool(config.translate),  # t0/t1 as before: one kernel
                PREFETCH=bool(config.prefetch),
                num_warps=config.warps, num_stages=config.stages, **options, **extra, **self.meta)


_SIDE = {}  # device index: the second stream of `i2`


def _beside(side_launch, main_launch, device: torch.device) -> None:
    """`side_launch` on a second stream and `main_launch` on the current one, both after the work queued so far, the
    current stream then waiting for the second (fork and join: also inside a CUDA graph's capture)."""
    main = torch.cuda.current_stream(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SIDE:
        _SIDE[index] = torch.cuda.Stream(index)
    side = _SIDE[index]
    side.wait_stream(main)
    with torch.cuda.stream(side):
        side_launch()
    main_launch()
    main.wait_stream(side)
