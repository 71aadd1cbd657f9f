"""Streamed word GEMVs for decode (Q2_0, Q4_0, Q8_0, Q4_K): persistent programs, the next step's loads issued ahead.

`wide_gemv.py`'s word kernels run a program per (pair or token, row tile) that loads a step of words, waits for
them, multiplies, and loads the next: one step's bytes in flight per thread, and at A3B's size (8 experts x 768
rows) ~3 waves of short programs whose last one leaves SMs idle. These kernels keep the word kernels' tile ([NU
units, BN rows, NT words], a thread per uint16 / uint32 of codes, rows wrapped inside each thread) and change the
schedule:
  - a fixed grid of `programs` programs (a few per SM) walks the work items (row tiles) in a grid-stride loop, so
    there is no tail of partly filled waves and no launch cost per tile;
  - the loop runs over the program's flattened (item, step) sequence and loads step s + 1's code words, scales and
    activations into registers before it multiplies step s ("register double buffering"), also across the
    boundary of two items, so a thread always has a step's loads in flight while it computes; the routing (expert
    ids, slot table, weights) is loaded one step earlier still, so those loads never hold up the words'.
Each step's arithmetic (`stream_steps.py`) spends fewer instructions a weight than the word kernels' (fields turned
into floats in place, activations pre-scaled by powers of two), and addresses are an expert's 64-bit base plus
32-bit offsets, the shapes compile-time constants: 259 SASS instructions a step of A3B's Q4_0 gate/up tile (sm_90
build) against the word kernel's 278 (and this loop's 413 before those changes). Each item's sums are the word
kernels' own (same tile, same step order, same final tree), so with equal tiles the outputs agree with theirs (bit
for bit under the interpreter; the tests check it) and stay within ERROR_BOUND of float64. Q2_0 / Q4_0 / Q8_0 (an
fp16 scale, then uint16 code words) and Q4_K (uint32 words, the super-block's scale fields loaded ahead with them)
take them, the i-quants keep the word kernels; the contracts are gemv.py's (slot table, a slot < 0 adding exactly
zero, no atomics). Rows beyond 32-bit offsets (rows x row bytes >= 2 GiB, a dense head at most) take the word
kernels too.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from strata.kernels.moe.stream_steps import fetch_words, fetch_x, step_dot

STREAM_FORMATS = {"Q2_0": (18, 1), "Q4_0": (18, 1), "Q8_0": (34, 1), "Q4_K": (144, 4)}  # block bytes, units a block
CPU_SMS = 1  # under the interpreter `programs` per "SM" is the grid itself (tests pick it to leave remainders)
CPU_FIT = 2  # what "as many as fit" (per_sm < 0) means under the interpreter
FIT = -1  # GemvConfig.stream: as many programs an SM as its registers, warps and shared memory let stay resident
SM90_REGISTERS, SM90_WARPS, SM90_PROGRAMS, SM90_SHARED = 65536, 64, 32, 227 * 1024  # per SM (H100 / H200)
_fitting: dict = {}


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def stream_grid(device: torch.device, per_sm: int, n_items: int) -> int:
    """The persistent grid: per_sm programs on each SM of the device, never more than there are items."""
    sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device()) \
        if device.type == "cuda" else CPU_SMS
    return max(1, min(n_items, sms * per_sm))


def resident_programs(n_regs: int, warps: int, shared: int) -> int:
    """Programs of `warps` warps, n_regs registers a thread and `shared` bytes that one sm_90 SM holds at once
    (registers are given out 8 a thread at a time)."""
    by_registers = SM90_REGISTERS // (-(-max(n_regs, 1) // 8) * 8 * 32 * warps)
    by_shared = SM90_SHARED // shared if shared else SM90_PROGRAMS
    return max(1, min(by_registers, SM90_WARPS // warps, by_shared, SM90_PROGRAMS))


def _per_sm(kernel, per_sm: int, device: torch.device, args: tuple, constants: dict, warps: int) -> int:
    """per_sm, or for FIT (< 0) the programs that stay resident: the compiled kernel's registers and shared memory
    (compiled once, before any CUDA graph capture, by the first eager call)."""
    if per_sm > 0:
        return per_sm
    if device.type != "cuda":
        return CPU_FIT
    key = (kernel.fn.__name__, device.index, warps, tuple(sorted(constants.items())))
    if key not in _fitting:
        try:
            compiled = kernel.warmup(*args, grid=(1,), **constants, num_warps=warps)
            compiled = compiled.result() if hasattr(compiled, "result") else compiled  # (an asynchronous compile)
            compiled._init_handles()  # loads the binary: its register count
            _fitting[key] = resident_programs(compiled.n_regs, warps, compiled.metadata.shared)
        except Exception:  # a Triton whose compiled kernels say less: half an SM's warps (the launch that follows
            _fitting[key] = max(1, SM90_WARPS // 2 // warps)  # raises any real compile error itself)
    last_fit[0] = _fitting[key]
    return _fitting[key]


last_fit = [0]  # the programs an SM the latest FIT launch resolved to (the benches print it)


@triton.jit
def _gate_up_route(s, total, ids, slot_of, N_TILES: tl.constexpr, SLOTS: tl.constexpr, STEPS: tl.constexpr):
    """The operand index of step s's expert (-1: not resident, or s >= total). Loaded a step before its words, so
    the word loads never wait on the routing's."""
    pair = (tl.program_id(0) + (s // STEPS) * tl.num_programs(0)) // N_TILES
    live = s < total
    index = tl.load(ids + pair, mask=live, other=0).to(tl.int32)
    if SLOTS:
        index = tl.load(slot_of + index, mask=live, other=-1).to(tl.int32)
    return tl.where(live, index, -1)


@triton.jit
def _gate_up_where(s, index, x, N_OUT: tl.constexpr, N_TILES: tl.constexpr, TOP_K: tl.constexpr, K: tl.constexpr,
                   N_UNITS: tl.constexpr, UNIT_W: tl.constexpr, BN: tl.constexpr, NU: tl.constexpr,
                   STEPS: tl.constexpr, BLOCK_BYTES: tl.constexpr, UNITS_PER_BLOCK: tl.constexpr):
    """Where step s reads, its expert at operand `index`: (the units' block offsets in the expert, int32 [NU, BN],
    the units [NU], blocks to read [NU, BN], activation pointers [NU], units to read [NU])."""
    ROW_BYTES: tl.constexpr = N_UNITS // UNITS_PER_BLOCK * BLOCK_BYTES
    item = tl.program_id(0) + (s // STEPS) * tl.num_programs(0)
    rows = (item % N_TILES) * BN + tl.arange(0, BN)
    blk = (s % STEPS) * NU + tl.arange(0, NU)
    um = (blk < N_UNITS) & (index >= 0)
    bm = um[:, None] & (rows < N_OUT)[None, :]
    off = (rows * ROW_BYTES)[None, :] + ((blk // UNITS_PER_BLOCK) * BLOCK_BYTES)[:, None]
    x_at = x + (item // N_TILES // TOP_K) * K + blk * UNIT_W
    return off, blk, bm, x_at, um


@triton.jit
def _stream_gate_up_kernel(x, ids, slot_of, wg, wu, hid, stride_g, stride_u, n_items,
                           N_OUT: tl.constexpr, TOP_K: tl.constexpr, K: tl.constexpr, FMT: tl.constexpr,
                           N_UNITS: tl.constexpr, UNIT_W: tl.constexpr, NT: tl.constexpr, SLOTS: tl.constexpr,
                           BN: tl.constexpr, NU: tl.constexpr, BLOCK_BYTES: tl.constexpr,
                           UNITS_PER_BLOCK: tl.constexpr):
    """H[pair, rows] = silu(gate rows . x) * (up rows . x) for the items (pair, row tile) pid, pid + programs, ...
    Step s multiplies what step s - 1 loaded, loads step s + 1's words and step s + 2's routing."""
    STEPS: tl.constexpr = (N_UNITS + NU - 1) // NU
    N_TILES: tl.constexpr = (N_OUT + BN - 1) // BN
    pid = tl.program_id(0)
    total = (n_items - pid + tl.num_programs(0) - 1) // tl.num_programs(0) * STEPS
    t = tl.arange(0, NT)
    index = _gate_up_route(0, total, ids, slot_of, N_TILES, SLOTS, STEPS)
    off, blk, bm, x_at, um = _gate_up_where(0, index, x, N_OUT, N_TILES, TOP_K, K, N_UNITS, UNIT_W, BN, NU, STEPS,
                                            BLOCK_BYTES, UNITS_PER_BLOCK)
    expert = tl.maximum(index, 0).to(tl.int64)
    ng_w, ng_0, ng_1, ng_2, ng_3 = fetch_words(FMT, wg + expert * stride_g, off, blk, t, bm)
    nu_w, nu_0, nu_1, nu_2, nu_3 = fetch_words(FMT, wu + expert * stride_u, off, blk, t, bm)
    xa_next, xb_next = fetch_x(FMT, x_at, t, um)
    index = _gate_up_route(1, total, ids, slot_of, N_TILES, SLOTS, STEPS)
    acc_g = tl.zeros((NU, BN, NT), tl.float32)
    acc_u = tl.zeros((NU, BN, NT), tl.float32)
    for s in range(0, total):
        g_w, g_0, g_1, g_2, g_3, xa, xb = ng_w, ng_0, ng_1, ng_2, ng_3, xa_next, xb_next
        u_w, u_0, u_1, u_2, u_3 = nu_w, nu_0, nu_1, nu_2, nu_3
        off, blk, bm, x_at, um = _gate_up_where(s + 1, index, x, N_OUT, N_TILES, TOP_K, K, N_UNITS, UNIT_W, BN, NU,
                                                STEPS, BLOCK_BYTES, UNITS_PER_BLOCK)
        expert = tl.maximum(index, 0).to(tl.int64)
        ng_w, ng_0, ng_1, ng_2, ng_3 = fetch_words(FMT, wg + expert * stride_g, off, blk, t, bm)
        nu_w, nu_0, nu_1, nu_2, nu_3 = fetch_words(FMT, wu + expert * stride_u, off, blk, t, bm)
        xa_next, xb_next = fetch_x(FMT, x_at, t, um)
        index = _gate_up_route(s + 2, total, ids, slot_of, N_TILES, SLOTS, STEPS)
        units = (s % STEPS) * NU + tl.arange(0, NU)
        acc_g += step_dot(FMT, g_w, g_0, g_1, g_2, g_3, xa, xb, units)
        acc_u += step_dot(FMT, u_w, u_0, u_1, u_2, u_3, xa, xb, units)
        if s % STEPS == STEPS - 1:  # the item's last step: its rows are done
            item = pid + (s // STEPS) * tl.num_programs(0)
            rows = (item % N_TILES) * BN + tl.arange(0, BN)
            g = tl.sum(tl.sum(acc_g, axis=2), axis=0)
            u = tl.sum(tl.sum(acc_u, axis=2), axis=0)
            tl.store(hid + (item // N_TILES) * N_OUT + rows, g / (1.0 + tl.exp(-g)) * u, mask=rows < N_OUT)
            acc_g = tl.zeros((NU, BN, NT), tl.float32)
            acc_u = tl.zeros((NU, BN, NT), tl.float32)


@triton.jit
def _down_route(s, total, ids, topk_w, slot_of, N_TILES: tl.constexpr, TOP_K: tl.constexpr, N_UNITS: tl.constexpr,
                SLOTS: tl.constexpr, NU: tl.constexpr, STEPS: tl.constexpr):
    """The operand index [NU] (-1: not resident, or out of range) and routing weight [NU] of step s's units, which
    run over (chosen expert, unit) flattened. Loaded a step before their words."""
    token = (tl.program_id(0) + (s // STEPS) * tl.num_programs(0)) // N_TILES
    g = (s % STEPS) * NU + tl.arange(0, NU)
    um = (g < TOP_K * N_UNITS) & (s < total)
    j = g // N_UNITS
    index = tl.load(ids + token * TOP_K + j, mask=um, other=0).to(tl.int32)
    if SLOTS:
        index = tl.load(slot_of + index, mask=um, other=-1).to(tl.int32)
    weight = tl.load(topk_w + token * TOP_K + j, mask=um, other=0.0).to(tl.float32)
    return tl.where(um, index, -1), weight


@triton.jit
def _down_where(s, index, h, wd, stride_d, N_OUT: tl.constexpr, N_TILES: tl.constexpr, TOP_K: tl.constexpr,
                K: tl.constexpr, N_UNITS: tl.constexpr, UNIT_W: tl.constexpr, BN: tl.constexpr, NU: tl.constexpr,
                STEPS: tl.constexpr, BLOCK_BYTES: tl.constexpr, UNITS_PER_BLOCK: tl.constexpr):
    """Where step s reads, its units' experts at operand `index` [NU]: (each unit's expert's first byte [NU, 1],
    block offsets in it int32 [NU, BN], each unit's place in its row [NU], blocks to read [NU, BN], activation
    pointers [NU], units to read [NU])."""
    ROW_BYTES: tl.constexpr = N_UNITS // UNITS_PER_BLOCK * BLOCK_BYTES
    item = tl.program_id(0) + (s // STEPS) * tl.num_programs(0)
    rows = (item % N_TILES) * BN + tl.arange(0, BN)
    g = (s % STEPS) * NU + tl.arange(0, NU)
    j = g // N_UNITS
    blk = g % N_UNITS
    um = index >= 0
    bm = um[:, None] & (rows < N_OUT)[None, :]
    w_at = wd + tl.maximum(index, 0).to(tl.int64) * stride_d
    off = (rows * ROW_BYTES)[None, :] + ((blk // UNITS_PER_BLOCK) * BLOCK_BYTES)[:, None]
    x_at = h + ((item // N_TILES) * TOP_K + j) * K + blk * UNIT_W
    return w_at[:, None], off, blk, bm, x_at, um


@triton.jit
def _stream_down_kernel(h, ids, topk_w, slot_of, wd, y, stride_d, n_items,
                        N_OUT: tl.constexpr, TOP_K: tl.constexpr, K: tl.constexpr, FMT: tl.constexpr,
                        N_UNITS: tl.constexpr, UNIT_W: tl.constexpr, NT: tl.constexpr, SLOTS: tl.constexpr,
                        BN: tl.constexpr, NU: tl.constexpr, BLOCK_BYTES: tl.constexpr,
                        UNITS_PER_BLOCK: tl.constexpr):
    """y[token, rows] = sum over chosen experts j and their units of w[token, j] * (unit's rows . h[token, j]'s
    slice), for the items (token, row tile) pid, pid + programs, ...; pipelined as the gate/up kernel."""
    STEPS: tl.constexpr = (TOP_K * N_UNITS + NU - 1) // NU
    N_TILES: tl.constexpr = (N_OUT + BN - 1) // BN
    pid = tl.program_id(0)
    total = (n_items - pid + tl.num_programs(0) - 1) // tl.num_programs(0) * STEPS
    t = tl.arange(0, NT)
    index, weight_next = _down_route(0, total, ids, topk_w, slot_of, N_TILES, TOP_K, N_UNITS, SLOTS, NU, STEPS)
    w_at, off, blk, bm, x_at, um = _down_where(0, index, h, wd, stride_d, N_OUT, N_TILES, TOP_K, K, N_UNITS, UNIT_W,
                                               BN, NU, STEPS, BLOCK_BYTES, UNITS_PER_BLOCK)
    n_w, n_0, n_1, n_2, n_3 = fetch_words(FMT, w_at, off, blk, t, bm)
    xa_next, xb_next = fetch_x(FMT, x_at, t, um)
    index, weight_after = _down_route(1, total, ids, topk_w, slot_of, N_TILES, TOP_K, N_UNITS, SLOTS, NU, STEPS)
    acc = tl.zeros((NU, BN, NT), tl.float32)
    for s in range(0, total):
        c_w, c_0, c_1, c_2, c_3, xa, xb, weight = n_w, n_0, n_1, n_2, n_3, xa_next, xb_next, weight_next
        w_at, off, blk, bm, x_at, um = _down_where(s + 1, index, h, wd, stride_d, N_OUT, N_TILES, TOP_K, K, N_UNITS,
                                                   UNIT_W, BN, NU, STEPS, BLOCK_BYTES, UNITS_PER_BLOCK)
        n_w, n_0, n_1, n_2, n_3 = fetch_words(FMT, w_at, off, blk, t, bm)
        xa_next, xb_next = fetch_x(FMT, x_at, t, um)
        weight_next = weight_after
        index, weight_after = _down_route(s + 2, total, ids, topk_w, slot_of, N_TILES, TOP_K, N_UNITS, SLOTS, NU,
                                          STEPS)
        units = ((s % STEPS) * NU + tl.arange(0, NU)) % N_UNITS
        acc += step_dot(FMT, c_w, c_0, c_1, c_2, c_3, xa, xb, units) * weight[:, None, None]
        if s % STEPS == STEPS - 1:
            item = pid + (s // STEPS) * tl.num_programs(0)
            rows = (item % N_TILES) * BN + tl.arange(0, BN)
            out = tl.sum(tl.sum(acc, axis=2), axis=0)
            tl.store(y + (item // N_TILES) * N_OUT + rows, out, mask=rows < N_OUT)
            acc = tl.zeros((NU, BN, NT), tl.float32)


def stream_applies(spec, rows: int, row_bytes: int, *byte_offsets: int) -> bool:
    """A format these kernels read, every block start aligned for its words (2 bytes; Q4_K: 4), and an expert's
    rows within reach of their 32-bit offsets."""
    align = 4 if spec.name == "Q4_K" else 2
    return (spec.name in STREAM_FORMATS and rows * row_bytes < 2**31
            and all(offset % align == 0 for offset in (row_bytes, *byte_offsets)))


def _constants(spec, n_out: int, n_in: int, top_k: int, slots: bool, bn: int, nu: int) -> dict:
    from strata.kernels.moe.wide_gemv import UNIT, WORDS

    block_bytes, units_per_block = STREAM_FORMATS[spec.name]
    return dict(N_OUT=n_out, TOP_K=top_k, K=n_in, FMT=spec.fmt_id, N_UNITS=n_in // UNIT[spec.name],
                UNIT_W=UNIT[spec.name], NT=WORDS[spec.name], SLOTS=slots, BN=bn, NU=nu, BLOCK_BYTES=block_bytes,
                UNITS_PER_BLOCK=units_per_block)


def launch_stream_gate_up(x, topk_ids, g, u, slot_of, hid, spec, bn: int, nu: int, warps: int, per_sm: int):
    """`_stream_gate_up_kernel` over operands g, u (gemv.ExpertOperand) into H [T, k, ff]: gate_up_swiglu's
    contract."""
    n_tokens, top_k = topk_ids.shape
    n_items = n_tokens * top_k * triton.cdiv(g.rows, bn)
    slots = slot_of is not None
    args = (x.contiguous(), topk_ids.contiguous(), slot_of if slots else topk_ids, g.raw, u.raw, hid, g.stride,
            u.stride, n_items)
    constants = _constants(spec, g.rows, g.cols, top_k, slots, bn, nu)
    per_sm = _per_sm(_stream_gate_up_kernel, per_sm, x.device, args, constants, warps)
    _stream_gate_up_kernel[(stream_grid(x.device, per_sm, n_items),)](*args, **constants, num_warps=warps)
    return hid


def launch_stream_down(h, topk_ids, topk_weights, d, slot_of, y, spec, bn: int, nu: int, warps: int, per_sm: int):
    """`_stream_down_kernel` over operand d into y [T, d.rows]: the down kernel's contract (and the dense matvec's)."""
    n_tokens, top_k = topk_ids.shape
    n_items = n_tokens * triton.cdiv(d.rows, bn)
    slots = slot_of is not None
    args = (h, topk_ids.contiguous(), topk_weights.contiguous(), slot_of if slots else topk_ids, d.raw, y, d.stride,
            n_items)
    constants = _constants(spec, d.rows, d.cols, top_k, slots, bn, nu)
    per_sm = _per_sm(_stream_down_kernel, per_sm, h.device, args, constants, warps)
    _stream_down_kernel[(stream_grid(h.device, per_sm, n_items),)](*args, **constants, num_warps=warps)
    return y
