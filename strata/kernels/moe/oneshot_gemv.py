"""One-shot decode GEMVs (Q2_0, Q4_0, Q8_0, Q4_K): a program loads every weight of its rows at once, then multiplies.

At decode sizes (a few MB a matrix, 1-2 us of HBM time) the word kernels (`wide_gemv.py`) and the streamed ones
(`stream_gemv.py`) are bound by latency and by instruction issue, not bandwidth: a program loads a step of NU units,
waits, multiplies and loads the next, so an SM has one step of each resident program in flight, and a tail of partly
filled waves follows. Here a program owns a small tile of BN rows (1-16) and its whole slice of the input (all of it
unless SPLIT cuts it): the code words, scales and activations of every unit are loaded by one burst of independent
loads with nothing in between, so each SM can hold its whole share of the matrix in flight at once (~45 KB for A3B's
q/k/v: about five programs of 4 warps an SM, one wave). The grid is rows / BN programs (times pairs or tokens);
there is no loop over the input at all.

The tile is `stream_steps`' ([NU units, BN rows, NT words], a thread per uint16 / uint32 of codes, rows wrapped
inside each thread so an activation serves all BN rows) and so is the arithmetic (`step_dot`); loads are addressed
in bytes from each block (`_fetch`), the sums reduced once over units and words (`_row_sums`). In sm_90 builds that
is ~7 instructions a weight against the word kernels' ~16 (issuing them is the larger part of these calls' time at
~4 warp-instructions a cycle an SM). Q4_K's words are uint32 runs of 32 bytes, 16-byte aligned (its 144-byte
super-blocks keep rows 16-byte aligned): they load 16 bytes wide (LDG.128); the 18- and 34-byte blocks of Q2_0 /
Q4_0 / Q8_0 are only 2-byte aligned in GGUF order, so their words stay uint16 loads.

Contracts are gemv.py's (slot table, a slot < 0 adding exactly zero, no atomics): an expert's combine weight scales
its activations before the dots (several experts) or the row sums (one: exact for the dense matvec's ones). The dense
matvec (one "expert" at stride 0: every token reads the same bytes) loads the weights once for all of a verify
window's 1..4 rows; each row then runs the same code on the same registers, so its sums and their order do not
depend on how many rows the call has (`SHARED`); routed calls run a program per token or pair, so neither do theirs.
Where SPLIT > 1 (inputs too long for one program's registers), slice s writes float32 partial sums that
`wide_gemv._sum_slices` adds in slice order (gate/up: then SwiGLU): deterministic. Precision: float32 sums of exact
products, within gemv.ERROR_BOUND of float64.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from strata.kernels.moe.decode import DecodeSpec
from strata.kernels.moe.stream_gemv import STREAM_FORMATS
from strata.kernels.moe.stream_steps import fetch_x, step_dot
from strata.kernels.moe.wide_gemv import SMS, UNIT, WORDS, _sum_slices, store_gate_up
from strata.kernels.pdl import launch_options, pdl_start, pdl_wait

ONESHOT_FORMATS = set(STREAM_FORMATS)
MIN_WARPS_PER_SM = 12  # resident warps an SM the grid should give at least (loads in flight), before rows shrink
WORDS_PER_THREAD = 32  # code words a thread holds at most (a register each): the rest for x and the sums
MAX_SPLIT = 8


@triton.jit
def _fetch(FMT: tl.constexpr, w_at, off, blk, t, bm):
    """`stream_steps.fetch_words`' loads, addressed in bytes (w_at + off + a constant), which lets the compiler
    fold each register's constant part into the load's offset instead of computing every address."""
    at = w_at + off  # [NU, BN]: each unit-row's block
    if FMT == 10:
        pair = (blk % 4)[:, None]
        word = tl.load((at + 16 + 32 * pair)[:, :, None].to(tl.pointer_type(tl.uint32)) + t[None, None, :],
                       mask=bm[:, :, None], other=0)
        dd = tl.load(at.to(tl.pointer_type(tl.uint32)), mask=bm, other=0)
        a = tl.load((at + 4 + 2 * pair).to(tl.pointer_type(tl.uint16)), mask=bm, other=0)
        c = tl.load((at + 8 + 2 * pair).to(tl.pointer_type(tl.uint16)), mask=bm, other=0)
        e = tl.load((at + 2 * pair).to(tl.pointer_type(tl.uint16)), mask=bm, other=0)
    else:
        word = tl.load((at + 2)[:, :, None].to(tl.pointer_type(tl.uint16)) + t[None, None, :],
                       mask=bm[:, :, None], other=0)
        dd = tl.load(at.to(tl.pointer_type(tl.uint16)), mask=bm, other=0)
        a = dd
        c = dd
        e = dd
    return word, dd, a, c, e


@triton.jit
def _row_sums(part):
    """[NU, BN, NT] -> [BN]: each row's partial dots summed in one reduction over units and words (two reductions,
    words then units, take ~12 % more instructions on sm_90: each goes through its own shuffles)."""
    rows_first = tl.permute(part, (1, 0, 2))
    return tl.sum(tl.reshape(rows_first, (part.shape[1], part.shape[0] * part.shape[2])), axis=1)


@triton.jit
def _units(SPLIT: tl.constexpr, PER: tl.constexpr, TOTAL: tl.constexpr, NU: tl.constexpr):
    """The flat unit indices [NU] of this program's slice (program axis 2) and which of them exist."""
    lane = tl.arange(0, NU)
    g = tl.program_id(2) * PER + lane
    return g, (lane < PER) & (g < TOTAL)


@triton.jit
def _oneshot_down_kernel(h, ids, topk_w, slot_of, wd, y, stride_d,
                         N_OUT: tl.constexpr, TOP_K: tl.constexpr, K: tl.constexpr, FMT: tl.constexpr,
                         N_UNITS: tl.constexpr, UNIT_W: tl.constexpr, NT: tl.constexpr, SLOTS: tl.constexpr,
                         BN: tl.constexpr, NU: tl.constexpr, SPLIT: tl.constexpr, PER: tl.constexpr,
                         ROWS: tl.constexpr, SHARED: tl.constexpr, BLOCK_BYTES: tl.constexpr,
                         UNITS_PER_BLOCK: tl.constexpr, SKIP_ABSENT: tl.constexpr = False,
                         PDL: tl.constexpr = 0, AHEAD: tl.constexpr = 0):
    """y[t, rows] = sum over chosen experts j and their units of w[t, j] * (unit's rows . h[t, j]'s slice), every
    unit of the slice loaded at once. Program (token group, row tile, slice): SHARED (one operand at stride 0: the
    dense matvec) a group is all ROWS tokens, which reuse the loaded words; else one token. SPLIT > 1: slice s into
    y[s, t, rows]. SKIP_ABSENT (the misses' launch, most pairs absent): see the branch below. PDL (kernels/pdl.py):
    AHEAD 1 (the dense matvec: one operand, no slot table) issues the weight loads before the wait, its one expert's
    index being 0 without reading `ids`; AHEAD 2 (experts, no slot table, STRATA_PDL=3: the routing is complete
    when this kernel launches) reads the routing through L2 and issues the weight loads before the wait; AHEAD 0
    reads everything after the wait."""
    pdl_start(PDL)
    first = tl.program_id(0) * (ROWS if SHARED else 1)
    rows = tl.program_id(1) * BN + tl.arange(0, BN)
    t = tl.arange(0, NT)
    g, um = _units(SPLIT, PER, TOP_K * N_UNITS, NU)
    j = g // N_UNITS
    blk = g % N_UNITS
    if AHEAD == 1:
        index = tl.where(um, 0, -1)  # what `ids` (zeros) gives: the operand at stride 0 is every row's "expert"
    elif AHEAD == 2:  # .cg: from L2, where the routing kernel's stores are (not a line this SM's L1 kept)
        index = tl.load(ids + first * TOP_K + j, mask=um, other=0, cache_modifier=".cg").to(tl.int32)
        index = tl.where(um, index, -1)
    else:
        pdl_wait(PDL)
        index = tl.load(ids + first * TOP_K + j, mask=um, other=0).to(tl.int32)
        if SLOTS:
            index = tl.load(slot_of + index, mask=um, other=-1).to(tl.int32)
        index = tl.where(um, index, -1)
    if SKIP_ABSENT:  # the misses' launch: a program none of whose experts is missing stores its zeros, no loads
        if tl.max(index, axis=0) >= 0:
            _down_rows(h, topk_w, wd, y, stride_d, first, rows, t, j, blk, um, index, N_OUT, TOP_K, K, FMT, N_UNITS,
                       UNIT_W, BN, ROWS, SHARED, BLOCK_BYTES, UNITS_PER_BLOCK, PDL, AHEAD)
        else:
            if AHEAD:  # (the launches never ask for both; a store still waits)
                pdl_wait(PDL)
            for r in tl.static_range(ROWS if SHARED else 1):
                at = (tl.program_id(2) * (tl.num_programs(0) * (ROWS if SHARED else 1)) + first + r).to(tl.int64)
                tl.store(y + at * N_OUT + rows, tl.zeros((BN,), tl.float32), mask=rows < N_OUT)
    else:
        _down_rows(h, topk_w, wd, y, stride_d, first, rows, t, j, blk, um, index, N_OUT, TOP_K, K, FMT, N_UNITS,
                   UNIT_W, BN, ROWS, SHARED, BLOCK_BYTES, UNITS_PER_BLOCK, PDL, AHEAD)


@triton.jit
def _down_rows(h, topk_w, wd, y, stride_d, first, rows, t, j, blk, um, index, N_OUT: tl.constexpr,
               TOP_K: tl.constexpr, K: tl.constexpr, FMT: tl.constexpr, N_UNITS: tl.constexpr, UNIT_W: tl.constexpr,
               BN: tl.constexpr, ROWS: tl.constexpr, SHARED: tl.constexpr, BLOCK_BYTES: tl.constexpr,
               UNITS_PER_BLOCK: tl.constexpr, PDL: tl.constexpr, AHEAD: tl.constexpr):
    """The down program's loads, dots and stores (`_oneshot_down_kernel`)."""
    word, s0, s1, s2, s3 = down_fetch(wd, stride_d, rows, t, blk, index, N_OUT, FMT, N_UNITS, BLOCK_BYTES,
                                      UNITS_PER_BLOCK)
    if AHEAD:
        pdl_wait(PDL)  # the weights above stream while the predecessor finishes; its activations after
    down_dots(h, topk_w, y, first, rows, t, j, blk, um, index, word, s0, s1, s2, s3, N_OUT, TOP_K, K, FMT, N_UNITS,
              UNIT_W, ROWS, SHARED)


@triton.jit
def down_fetch(wd, stride_d, rows, t, blk, index, N_OUT: tl.constexpr, FMT: tl.constexpr, N_UNITS: tl.constexpr,
               BLOCK_BYTES: tl.constexpr, UNITS_PER_BLOCK: tl.constexpr):
    """A down program's weight loads (its experts' rows of its tile), issued together: no activation needed."""
    ROW_BYTES: tl.constexpr = N_UNITS // UNITS_PER_BLOCK * BLOCK_BYTES
    bm = (index >= 0)[:, None] & (rows < N_OUT)[None, :]
    w_at = wd + tl.maximum(index, 0).to(tl.int64)[:, None] * stride_d
    off = (rows * ROW_BYTES)[None, :] + ((blk // UNITS_PER_BLOCK) * BLOCK_BYTES)[:, None]
    return _fetch(FMT, w_at, off, blk, t, bm)


@triton.jit
def down_dots(h, topk_w, y, first, rows, t, j, blk, um, index, word, s0, s1, s2, s3, N_OUT: tl.constexpr,
              TOP_K: tl.constexpr, K: tl.constexpr, FMT: tl.constexpr, N_UNITS: tl.constexpr, UNIT_W: tl.constexpr,
              ROWS: tl.constexpr, SHARED: tl.constexpr):
    """A down program's activations, dots and stores over the loaded weights (`down_fetch`)."""
    for r in tl.static_range(ROWS if SHARED else 1):
        token = first + r
        xa, xb = fetch_x(FMT, h + (token * TOP_K + j).to(tl.int64) * K + blk * UNIT_W, t, um & (index >= 0))
        if TOP_K == 1:  # one weight a token: applied to the row sums (exact for the dense matvec's ones)
            out = _row_sums(step_dot(FMT, word, s0, s1, s2, s3, xa, xb, blk)) * tl.load(topk_w + token).to(tl.float32)
        else:  # an expert's weight scales its activations: fewer products than its partial dots
            weight = tl.load(topk_w + token * TOP_K + j, mask=um, other=0.0).to(tl.float32)[None, :, None]
            xa = xa.to(tl.float32) * weight
            xb = xb.to(tl.float32) * weight
            out = _row_sums(step_dot(FMT, word, s0, s1, s2, s3, xa, xb, blk))
        at = (tl.program_id(2) * (tl.num_programs(0) * (ROWS if SHARED else 1)) + token).to(tl.int64) * N_OUT
        tl.store(y + at + rows, out, mask=rows < N_OUT)


@triton.jit
def _oneshot_gate_up_kernel(x, ids, slot_of, wg, wu, hid, stride_g, stride_u,
                            N_OUT: tl.constexpr, TOP_K: tl.constexpr, K: tl.constexpr, FMT: tl.constexpr,
                            N_UNITS: tl.constexpr, UNIT_W: tl.constexpr, NT: tl.constexpr, SLOTS: tl.constexpr,
                            BN: tl.constexpr, NU: tl.constexpr, SPLIT: tl.constexpr, PER: tl.constexpr,
                            BLOCK_BYTES: tl.constexpr, UNITS_PER_BLOCK: tl.constexpr,
                            SKIP_ABSENT: tl.constexpr = False, PDL: tl.constexpr = 0):
    """H[pair, rows] = silu(gate rows . x) * (up rows . x): the gate and up rows of one (token, chosen expert) pair
    loaded at once by one program, SwiGLU in its epilogue. SPLIT > 1: slice s's gate and up dots into
    hid[s, 0 / 1, pair, rows]. SKIP_ABSENT (the misses' launch, most pairs absent): see the branch below. PDL
    (kernels/pdl.py): the weights an expert's id names, so every load after the wait."""
    pdl_start(PDL)
    pdl_wait(PDL)
    gate_up_item(x, ids, slot_of, wg, wu, hid, stride_g, stride_u, tl.program_id(0), tl.program_id(1), N_OUT, TOP_K,
                 K, FMT, N_UNITS, UNIT_W, NT, SLOTS, BN, NU, SPLIT, PER, BLOCK_BYTES, UNITS_PER_BLOCK, SKIP_ABSENT)


@triton.jit
def gate_up_item(x, ids, slot_of, wg, wu, hid, stride_g, stride_u, pair, tile, N_OUT: tl.constexpr,
                 TOP_K: tl.constexpr, K: tl.constexpr, FMT: tl.constexpr, N_UNITS: tl.constexpr, UNIT_W: tl.constexpr,
                 NT: tl.constexpr, SLOTS: tl.constexpr, BN: tl.constexpr, NU: tl.constexpr, SPLIT: tl.constexpr,
                 PER: tl.constexpr, BLOCK_BYTES: tl.constexpr, UNITS_PER_BLOCK: tl.constexpr,
                 SKIP_ABSENT: tl.constexpr):
    """One gate/up program's work once the routing is readable: pair `pair`'s rows of row tile `tile`
    (`_oneshot_gate_up_kernel`'s body; also an item of the chained MoE launch, kernels/moe/chain_moe.py)."""
    rows = tile * BN + tl.arange(0, BN)
    t = tl.arange(0, NT)
    blk, um = _units(SPLIT, PER, N_UNITS, NU)
    index = tl.load(ids + pair + blk * 0, mask=um, other=0).to(tl.int32)
    if SLOTS:
        index = tl.load(slot_of + index, mask=um, other=-1).to(tl.int32)
    index = tl.where(um, index, -1)
    if SKIP_ABSENT:  # the misses' launch: a pair whose expert is not missing stores its zeros, no loads or dots
        if tl.max(index, axis=0) >= 0:
            _gate_up_rows(x, wg, wu, hid, stride_g, stride_u, pair, rows, t, blk, um, index, N_OUT, TOP_K, K, FMT,
                          N_UNITS, UNIT_W, SPLIT, BLOCK_BYTES, UNITS_PER_BLOCK)
        else:
            zero = tl.zeros((BN,), tl.float32)
            store_gate_up(hid, pair, rows, zero, zero, N_OUT, rows < N_OUT, SPLIT)
    else:
        _gate_up_rows(x, wg, wu, hid, stride_g, stride_u, pair, rows, t, blk, um, index, N_OUT, TOP_K, K, FMT,
                      N_UNITS, UNIT_W, SPLIT, BLOCK_BYTES, UNITS_PER_BLOCK)


@triton.jit
def _gate_up_rows(x, wg, wu, hid, stride_g, stride_u, pair, rows, t, blk, um, index, N_OUT: tl.constexpr,
                  TOP_K: tl.constexpr, K: tl.constexpr, FMT: tl.constexpr, N_UNITS: tl.constexpr,
                  UNIT_W: tl.constexpr, SPLIT: tl.constexpr, BLOCK_BYTES: tl.constexpr,
                  UNITS_PER_BLOCK: tl.constexpr):
    """The gate/up program's loads, dots and SwiGLU store (`_oneshot_gate_up_kernel`)."""
    ROW_BYTES: tl.constexpr = N_UNITS // UNITS_PER_BLOCK * BLOCK_BYTES
    bm = (index >= 0)[:, None] & (rows < N_OUT)[None, :]
    expert = tl.maximum(index, 0).to(tl.int64)[:, None]
    off = (rows * ROW_BYTES)[None, :] + ((blk // UNITS_PER_BLOCK) * BLOCK_BYTES)[:, None]
    g_w, g_0, g_1, g_2, g_3 = _fetch(FMT, wg + expert * stride_g, off, blk, t, bm)
    u_w, u_0, u_1, u_2, u_3 = _fetch(FMT, wu + expert * stride_u, off, blk, t, bm)
    xa, xb = fetch_x(FMT, x + (pair // TOP_K).to(tl.int64) * K + blk * UNIT_W, t, um & (index >= 0))
    g = _row_sums(step_dot(FMT, g_w, g_0, g_1, g_2, g_3, xa, xb, blk))
    u = _row_sums(step_dot(FMT, u_w, u_0, u_1, u_2, u_3, xa, xb, blk))
    store_gate_up(hid, pair, rows, g, u, N_OUT, rows < N_OUT, SPLIT)


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def slice_units(total: int, split: int) -> tuple[int, int]:
    """(PER units a slice, NU: the power of two of lanes that holds them) for `total` units cut in `split`."""
    per = -(-total // split)
    return per, _pow2(per)


def oneshot_tile(spec: DecodeSpec, n_out: int, n_units: int, programs: int, operands: int, on_gpu: bool
                 ) -> tuple[int, int, int]:
    """(BN rows, warps, SPLIT) of a one-shot program over `n_units` units (all chosen experts' for the down kernel)
    for n_out rows, `programs` programs a row tile (pairs or tokens), `operands` matrices read (gate/up: 2).

    On a GPU the limit at these sizes is issuing instructions as much as HBM (sm_90 builds: 904 instructions a
    thread for A3B's q/k/v tile, 7.1 a weight, against the word kernel's 16.5): more rows a program share each
    activation and the reduction, so rows start at 8, and a thread keeps at most WORDS_PER_THREAD code words (warps
    4, 8 or 16, then the input cut in slices). Rows halve only while the grid gives fewer than MIN_WARPS_PER_SM warps
    an SM of an H200. Under the interpreter, whose cost is per operation: the widest tiles, no split."""
    if not on_gpu:
        return min(64, _pow2(n_out)), 4, 1

    def words(bn: int, warps: int, split: int) -> float:
        return operands * slice_units(n_units, split)[1] * bn * WORDS[spec.name] / (32 * warps)

    def fit(bn: int) -> tuple[int, int, int]:
        warps, split = 4, 1
        while words(bn, warps, split) > WORDS_PER_THREAD and warps < 16:
            warps *= 2
        while words(bn, warps, split) > WORDS_PER_THREAD and split < MAX_SPLIT:
            split += 1
        return bn, warps, split

    bn, warps, split = fit(8)
    while bn > 1 and programs * -(-n_out // bn) * split * warps < MIN_WARPS_PER_SM * SMS:
        bn, warps, split = fit(bn // 2)
    return bn, warps, split


def _constants(spec: DecodeSpec, n_out: int, n_in: int, top_k: int, slots: bool, bn: int, split: int) -> dict:
    block_bytes, units_per_block = STREAM_FORMATS[spec.name]
    n_units = n_in // UNIT[spec.name]
    per, nu = slice_units(n_units * top_k, split)
    return dict(N_OUT=n_out, TOP_K=top_k, K=n_in, FMT=spec.fmt_id, N_UNITS=n_units, UNIT_W=UNIT[spec.name],
                NT=WORDS[spec.name], SLOTS=slots, BN=bn, NU=nu, SPLIT=split, PER=per, BLOCK_BYTES=block_bytes,
                UNITS_PER_BLOCK=units_per_block)


def launch_oneshot_down(h, topk_ids, topk_weights, d, slot_of, y, spec: DecodeSpec, bn: int, warps: int,
                        split: int = 1, skip_absent: bool = False, routing_ahead: bool = False):
    """`_oneshot_down_kernel` over operand d (gemv.ExpertOperand) into y [T, d.rows]: the down kernel's contract
    (and the dense matvec's: an operand at stride 0 read once for all T rows). `routing_ahead` (STRATA_PDL=3, the
    launch after the experts' gate/up launch): the routing was complete before this launch (kernels/pdl.py)."""
    n_tokens, top_k = topk_ids.shape
    slots = slot_of is not None
    shared = d.stride == 0 and top_k == 1 and not slots
    out = y if split == 1 else torch.empty(split, *y.shape, dtype=torch.float32, device=y.device)
    groups = 1 if shared else n_tokens
    _oneshot_down_kernel[(groups, triton.cdiv(d.rows, bn), split)](
        h, topk_ids.contiguous(), topk_weights.contiguous(), slot_of if slots else topk_ids, d.raw, out, d.stride,
        **_constants(spec, d.rows, d.cols, top_k, slots, bn, split), ROWS=n_tokens if shared else 1, SHARED=shared,
        SKIP_ABSENT=skip_absent, num_warps=warps,  # (ROWS only where shared: routed calls of any T share one build)
        **launch_options(h, AHEAD=1 if shared and not skip_absent else
                         2 if routing_ahead and not (slots or skip_absent) else 0))
    if split > 1:
        _sum_slices(out, y, split, False)
    return y


def launch_oneshot_gate_up(x, topk_ids, g, u, slot_of, hid, spec: DecodeSpec, bn: int, warps: int, split: int = 1,
                           skip_absent: bool = False, late: bool = False):
    """`_oneshot_gate_up_kernel` over operands g, u into H [T, k, ff] (float32): gate_up_swiglu's contract.
    `skip_absent`: programs of absent pairs store zeros without loads or dots (DecodeExperts.sparse). `late`
    (STRATA_PDL=3): the next kernel launches once this one is past its wait (kernels/pdl.py)."""
    n_tokens, top_k = topk_ids.shape
    slots = slot_of is not None
    out = hid if split == 1 else torch.empty(split, 2, *hid.shape, dtype=torch.float32, device=hid.device)
    constants = _constants(spec, g.rows, g.cols, 1, slots, bn, split)
    _oneshot_gate_up_kernel[(n_tokens * top_k, triton.cdiv(g.rows, bn), split)](
        x.contiguous(), topk_ids.contiguous(), slot_of if slots else topk_ids, g.raw, u.raw, out, g.stride,
        u.stride, **{**constants, "TOP_K": top_k}, SKIP_ABSENT=skip_absent, num_warps=warps, **launch_options(x, late))
    if split > 1:
        _sum_slices(out, hid, split, True)
    return hid
