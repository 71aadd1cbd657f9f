"""Streamed word GEMVs for decode (Q2_0, Q4_0, Q8_0, Q4_K): persistent programs, the next step's loads issued ahead.

`wide_gemv.py`'s word kernels run a program per (pair or token, row tile) that loads a step of words, waits for
them, multiplies, and loads the next: one step's bytes in flight per thread, and at A3B's size (8 experts x 768
rows) ~3 waves of short programs whose last one leaves SMs idle. These kernels keep the word kernels' tile
([NU units, BN rows, NT words], a thread per uint16 / uint32 of codes, rows wrapped inside each thread) and change the
schedule:
  - a fixed grid of `programs` programs (a few per SM) walks the work items (row tiles) in a grid-stride loop, so
    there is no tail of partly filled waves and no launch cost per tile;
  - the loop runs over the program's flattened (item, step) sequence and loads step s + 1's code words, scales and
    activations into registers before it multiplies step s ("register double buffering"), also across the
    boundary of two items, so a thread always has a step's loads in flight while it computes; the routing (expert
    ids, slot table, weights) is loaded one step earlier still, so those loads never hold up the words'.
Each item's sums are the word kernels' own (same tile, same step order, same final tree), so with equal tiles the
outputs agree with theirs (bit for bit under the interpreter; the tests check it) and stay within ERROR_BOUND of
float64. Q2_0 / Q4_0 / Q8_0 (an fp16 scale, then uint16 code words) and Q4_K (uint32 words, the super-block's
scale fields loaded ahead with them) take them, the i-quants keep the word kernels; the contracts are gemv.py's
(slot table, a slot < 0 adding exactly zero, no atomics).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from strata.kernels.moe.word_loads import codes

STREAM_FORMATS = {"Q2_0": 9, "Q4_0": 9, "Q8_0": 17, "Q4_K": 72}  # halfwords a block (Q4_K: a super-block)
CPU_SMS = 1  # under the interpreter `programs` per "SM" is the grid itself (tests pick it to leave remainders)


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def stream_grid(device: torch.device, per_sm: int, n_items: int) -> int:
    """The persistent grid: per_sm programs on each SM of the device, never more than there are items."""
    sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device()) \
        if device.type == "cuda" else CPU_SMS
    return max(1, min(n_items, sms * per_sm))


@triton.jit
def _x_run(x_at, t, um, STRIDE: tl.constexpr, WIDTH: tl.constexpr, OFFSET: tl.constexpr):
    """Activations x_at[u] + OFFSET + STRIDE*t + (0..WIDTH-1) as one load [NT, NU, WIDTH] (float32), the words'
    lane order (as word_loads.pairs: t fastest, then units), split in registers by the caller."""
    at = x_at[None, :, None] + OFFSET + STRIDE * t[:, None, None] + tl.arange(0, WIDTH)[None, None, :]
    return tl.load(at, mask=um[None, :, None], other=0.0).to(tl.float32)


@triton.jit
def _halves(v):
    """[NT, NU, 2] -> its two [NU, NT] halves."""
    lo, hi = tl.split(v)
    return tl.trans(lo), tl.trans(hi)


@triton.jit
def _quarters(v):
    """[NT, NU, 4] -> elements 0..3 as [NU, NT] each."""
    even, odd = tl.split(tl.reshape(v, (v.shape[0], v.shape[1], 2, 2)))  # k = 0, 2 and k = 1, 3
    x0, x2 = tl.split(even)
    x1, x3 = tl.split(odd)
    return tl.trans(x0), tl.trans(x1), tl.trans(x2), tl.trans(x3)


@triton.jit
def fetch_words(FMT: tl.constexpr, w, base, blk, t, bm, BLOCK_HALVES: tl.constexpr):
    """The loads of units blk [NU] of the rows starting at bytes base [NU, BN] of w (bm: the units to read): the code
    words [NU, BN, NT] and the scale fields [NU, BN] four times. Q2_0 / Q4_0 / Q8_0: uint16 words after the block's
    fp16 scale bits (then the same scale three times more: nothing more is loaded); Q4_K (unit = slice pair
    blk % 4 of super-block blk // 4): uint32 words, then d | dmin << 16 and the halfwords of the 6-bit scale bytes
    at 4 + 2p, 8 + 2p and 2p (p = the pair; `wide_gemv._unit_dot` reads the same bytes one by one)."""
    if FMT == 10:
        block = base + ((blk // 4) * (2 * BLOCK_HALVES))[:, None]
        pair = (blk % 4)[:, None]
        w32 = w.to(tl.pointer_type(tl.uint32))
        h16 = w.to(tl.pointer_type(tl.uint16))
        word = tl.load(w32 + ((block + 16 + 32 * pair) // 4)[:, :, None] + t[None, None, :], mask=bm[:, :, None],
                       other=0)
        dd = tl.load(w32 + block // 4, mask=bm, other=0)
        a = tl.load(h16 + (block + 4 + 2 * pair) // 2, mask=bm, other=0)
        c = tl.load(h16 + (block + 8 + 2 * pair) // 2, mask=bm, other=0)
        e = tl.load(h16 + (block + 2 * pair) // 2, mask=bm, other=0)
        return word, dd, a, c, e
    else:
        h16 = w.to(tl.pointer_type(tl.uint16))
        first = base // 2 + (blk * BLOCK_HALVES)[:, None]
        word = tl.load(h16 + first[:, :, None] + 1 + t[None, None, :], mask=bm[:, :, None], other=0)
        d = tl.load(h16 + first, mask=bm, other=0)
        return word, d, d, d, d


@triton.jit
def fetch_x(FMT: tl.constexpr, x_at, t, um):
    """The activations of each word, raw ([NT, NU, 4 or 2], twice): Q2_0 weights 8t..8t+3 and 8t+4..8t+7, Q4_K
    4t..4t+3 of both 32-weight halves, Q4_0 2t, 2t+1 and 2t+16, 2t+17, Q8_0 2t, 2t+1 (the second the first again)."""
    if FMT == 0:
        xa = _x_run(x_at, t, um, 8, 4, 0)
        xb = _x_run(x_at, t, um, 8, 4, 4)
    elif FMT == 10:
        xa = _x_run(x_at, t, um, 4, 4, 0)
        xb = _x_run(x_at, t, um, 4, 4, 32)
    elif FMT == 1:
        xa = _x_run(x_at, t, um, 2, 2, 0)
        xb = _x_run(x_at, t, um, 2, 2, 16)
    else:
        xa = _x_run(x_at, t, um, 2, 2, 0)
        xb = xa
    return xa, xb


@triton.jit
def _q4_k_dot(word, dd, a, c, e, xa, xb, pair):
    """Q4_K's slice-pair dots: word t holds weights 4t..4t+3 of both halves (low, high nibbles); per 32-weight
    half d*sc * sum q x - dmin*m * sum x, sc and m the 6-bit fields of sub-blocks 2p, 2p + 1."""
    x0, x1, x2, x3 = _quarters(xa)
    dot_lo = codes(word, 0, 15, 0.0) * x0[:, None, :] + codes(word, 8, 15, 0.0) * x1[:, None, :]
    dot_lo += codes(word, 16, 15, 0.0) * x2[:, None, :] + codes(word, 24, 15, 0.0) * x3[:, None, :]
    sum_lo = (x0 + x1) + (x2 + x3)
    x0, x1, x2, x3 = _quarters(xb)
    dot_hi = codes(word, 4, 15, 0.0) * x0[:, None, :] + codes(word, 12, 15, 0.0) * x1[:, None, :]
    dot_hi += codes(word, 20, 15, 0.0) * x2[:, None, :] + codes(word, 28, 15, 0.0) * x3[:, None, :]
    sum_hi = (x0 + x1) + (x2 + x3)
    a = a.to(tl.int32)
    c = c.to(tl.int32)
    e = e.to(tl.int32)
    a0, a1, c0, c1, e0, e1 = a & 255, a >> 8, c & 255, c >> 8, e & 255, e >> 8
    low = pair[:, None] < 2  # sub-blocks 0..3 keep their 6 bits in place; 4..7 split them
    sc0 = tl.where(low, a0 & 63, (c0 & 15) | ((e0 >> 2) & 48)).to(tl.float32)
    sc1 = tl.where(low, a1 & 63, (c1 & 15) | ((e1 >> 2) & 48)).to(tl.float32)
    mn0 = tl.where(low, c0 & 63, (c0 >> 4) | ((a0 >> 2) & 48)).to(tl.float32)
    mn1 = tl.where(low, c1 & 63, (c1 >> 4) | ((a1 >> 2) & 48)).to(tl.float32)
    d = (dd & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    dmin = (dd >> 16).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    part = dot_lo * (d * sc0)[:, :, None] + dot_hi * (d * sc1)[:, :, None]
    return part - (dmin * mn0)[:, :, None] * sum_lo[:, None, :] - (dmin * mn1)[:, :, None] * sum_hi[:, None, :]


@triton.jit
def step_dot(FMT: tl.constexpr, word, s0, s1, s2, s3, xa, xb, blk):
    """The scaled partial dots [NU, BN, NT] of a fetched step (units blk [NU]): `wide_gemv._unit_dot`'s sums, in
    its order."""
    if FMT == 10:
        s = _q4_k_dot(word.to(tl.uint32), s0, s1, s2, s3, xa, xb, blk % 4)
    else:
        s = _block_dot(FMT, word.to(tl.uint32), xa, xb) * s0.to(tl.float16, bitcast=True).to(tl.float32)[:, :, None]
    return s


@triton.jit
def _block_dot(FMT: tl.constexpr, word, xa, xb):
    """Q2_0 / Q4_0 / Q8_0: the unscaled dots [NU, BN, NT] of each word's codes with their activations."""
    if FMT == 0:  # Q2_0: halfword t holds weights 8t..8t+7, two bits each, weight = d * (code - 1)
        x0, x1, x2, x3 = _quarters(xa)
        s = codes(word, 0, 3, 1.0) * x0[:, None, :] + codes(word, 2, 3, 1.0) * x1[:, None, :]
        s += codes(word, 4, 3, 1.0) * x2[:, None, :] + codes(word, 6, 3, 1.0) * x3[:, None, :]
        x0, x1, x2, x3 = _quarters(xb)
        s += codes(word, 8, 3, 1.0) * x0[:, None, :] + codes(word, 10, 3, 1.0) * x1[:, None, :]
        s += codes(word, 12, 3, 1.0) * x2[:, None, :] + codes(word, 14, 3, 1.0) * x3[:, None, :]
    elif FMT == 1:  # Q4_0: weights 2t, 2t+1 (low nibbles of the word's bytes) and 2t+16, 2t+17 (high)
        x0, x1 = _halves(xa)
        x16, x17 = _halves(xb)
        s = codes(word, 0, 15, 8.0) * x0[:, None, :]
        s += codes(word, 8, 15, 8.0) * x1[:, None, :]
        s += codes(word, 4, 15, 8.0) * x16[:, None, :]
        s += codes(word, 12, 15, 8.0) * x17[:, None, :]
    else:  # Q8_0: int8 codes 2t, 2t+1, read as q + 128 (the bytes' top bits flipped)
        x0, x1 = _halves(xa)
        word = word ^ 0x8080
        s = codes(word, 0, 255, 128.0) * x0[:, None, :]
        s += codes(word, 8, 255, 128.0) * x1[:, None, :]
    return s


@triton.jit
def _gate_up_route(s, total, ids, slot_of, n_tiles, SLOTS: tl.constexpr, STEPS: tl.constexpr):
    """The operand index of step s's expert (-1: not resident, or s >= total). Loaded a step before its words, so
    the word loads never wait on the routing's."""
    pair = (tl.program_id(0) + (s // STEPS) * tl.num_programs(0)) // n_tiles
    live = s < total
    index = tl.load(ids + pair, mask=live, other=0).to(tl.int32)
    if SLOTS:
        index = tl.load(slot_of + index, mask=live, other=-1).to(tl.int32)
    return tl.where(live, index, -1)


@triton.jit
def _gate_up_where(s, index, x, stride_g, stride_u, row_bytes, n_ff, n_tiles,
                   TOP_K: tl.constexpr, K: tl.constexpr, N_UNITS: tl.constexpr, UNIT_W: tl.constexpr,
                   BN: tl.constexpr, NU: tl.constexpr, STEPS: tl.constexpr):
    """Where step s reads, its expert at operand `index`: (gate's and up's row starts in bytes [NU, BN], the
    units [NU], blocks to read [NU, BN], activation pointers [NU], units to read [NU])."""
    item = tl.program_id(0) + (s // STEPS) * tl.num_programs(0)
    pair = item // n_tiles
    rows = (item % n_tiles) * BN + tl.arange(0, BN)
    blk = (s % STEPS) * NU + tl.arange(0, NU)
    um = (blk < N_UNITS) & (index >= 0)
    bm = um[:, None] & (rows < n_ff)[None, :]
    expert = tl.maximum(index, 0).to(tl.int64)
    at = (rows.to(tl.int64) * row_bytes)[None, :] + tl.zeros((NU, 1), tl.int64)
    x_at = x + (pair // TOP_K).to(tl.int64) * K + blk * UNIT_W
    return expert * stride_g + at, expert * stride_u + at, blk, bm, x_at, um


@triton.jit
def _stream_gate_up_kernel(x, ids, slot_of, wg, wu, hid, n_ff, stride_g, stride_u, row_bytes, n_items,
                           TOP_K: tl.constexpr, K: tl.constexpr, FMT: tl.constexpr, N_UNITS: tl.constexpr,
                           UNIT_W: tl.constexpr, NT: tl.constexpr, SLOTS: tl.constexpr, BN: tl.constexpr,
                           NU: tl.constexpr, BLOCK_HALVES: tl.constexpr):
    """H[pair, rows] = silu(gate rows . x) * (up rows . x) for the items (pair, row tile) pid, pid + programs, ...
    Step s multiplies what step s - 1 loaded, loads step s + 1's words and step s + 2's routing."""
    STEPS: tl.constexpr = (N_UNITS + NU - 1) // NU
    n_tiles = (n_ff + BN - 1) // BN
    pid = tl.program_id(0)
    total = (n_items - pid + tl.num_programs(0) - 1) // tl.num_programs(0) * STEPS
    t = tl.arange(0, NT)
    index = _gate_up_route(0, total, ids, slot_of, n_tiles, SLOTS, STEPS)
    base_g, base_u, blk, bm, x_at, um = _gate_up_where(0, index, x, stride_g, stride_u, row_bytes, n_ff, n_tiles,
                                                       TOP_K, K, N_UNITS, UNIT_W, BN, NU, STEPS)
    ng_w, ng_0, ng_1, ng_2, ng_3 = fetch_words(FMT, wg, base_g, blk, t, bm, BLOCK_HALVES)
    nu_w, nu_0, nu_1, nu_2, nu_3 = fetch_words(FMT, wu, base_u, blk, t, bm, BLOCK_HALVES)
    xa_next, xb_next = fetch_x(FMT, x_at, t, um)
    index = _gate_up_route(1, total, ids, slot_of, n_tiles, SLOTS, STEPS)
    acc_g = tl.zeros((NU, BN, NT), tl.float32)
    acc_u = tl.zeros((NU, BN, NT), tl.float32)
    for s in range(0, total):
        g_w, g_0, g_1, g_2, g_3, xa, xb = ng_w, ng_0, ng_1, ng_2, ng_3, xa_next, xb_next
        u_w, u_0, u_1, u_2, u_3 = nu_w, nu_0, nu_1, nu_2, nu_3
        base_g, base_u, blk, bm, x_at, um = _gate_up_where(s + 1, index, x, stride_g, stride_u, row_bytes, n_ff,
                                                           n_tiles, TOP_K, K, N_UNITS, UNIT_W, BN, NU, STEPS)
        ng_w, ng_0, ng_1, ng_2, ng_3 = fetch_words(FMT, wg, base_g, blk, t, bm, BLOCK_HALVES)
        nu_w, nu_0, nu_1, nu_2, nu_3 = fetch_words(FMT, wu, base_u, blk, t, bm, BLOCK_HALVES)
        xa_next, xb_next = fetch_x(FMT, x_at, t, um)
        index = _gate_up_route(s + 2, total, ids, slot_of, n_tiles, SLOTS, STEPS)
        units = (s % STEPS) * NU + tl.arange(0, NU)
        acc_g += step_dot(FMT, g_w, g_0, g_1, g_2, g_3, xa, xb, units)
        acc_u += step_dot(FMT, u_w, u_0, u_1, u_2, u_3, xa, xb, units)
        if s % STEPS == STEPS - 1:  # the item's last step: its rows are done
            item = pid + (s // STEPS) * tl.num_programs(0)
            rows = (item % n_tiles) * BN + tl.arange(0, BN)
            g = tl.sum(tl.sum(acc_g, axis=2), axis=0)
            u = tl.sum(tl.sum(acc_u, axis=2), axis=0)
            tl.store(hid + (item // n_tiles).to(tl.int64) * n_ff + rows, g / (1.0 + tl.exp(-g)) * u,
                     mask=rows < n_ff)
            acc_g = tl.zeros((NU, BN, NT), tl.float32)
            acc_u = tl.zeros((NU, BN, NT), tl.float32)


@triton.jit
def _down_route(s, total, ids, topk_w, slot_of, n_tiles, TOP_K: tl.constexpr, N_UNITS: tl.constexpr,
                SLOTS: tl.constexpr, NU: tl.constexpr, STEPS: tl.constexpr):
    """The operand index [NU] (-1: not resident, or out of range) and routing weight [NU] of step s's units, which
    run over (chosen expert, unit) flattened. Loaded a step before their words."""
    token = (tl.program_id(0) + (s // STEPS) * tl.num_programs(0)) // n_tiles
    g = (s % STEPS) * NU + tl.arange(0, NU)
    um = (g < TOP_K * N_UNITS) & (s < total)
    j = g // N_UNITS
    index = tl.load(ids + token * TOP_K + j, mask=um, other=0).to(tl.int32)
    if SLOTS:
        index = tl.load(slot_of + index, mask=um, other=-1).to(tl.int32)
    weight = tl.load(topk_w + token * TOP_K + j, mask=um, other=0.0).to(tl.float32)
    return tl.where(um, index, -1), weight


@triton.jit
def _down_where(s, index, h, stride_d, row_bytes, n_out, n_tiles, TOP_K: tl.constexpr, K: tl.constexpr,
                N_UNITS: tl.constexpr, UNIT_W: tl.constexpr, BN: tl.constexpr, NU: tl.constexpr,
                STEPS: tl.constexpr):
    """Where step s reads, its units' experts at operand `index` [NU]: (row starts in bytes [NU, BN], each unit's
    place in its row [NU], blocks to read [NU, BN], activation pointers [NU], units to read [NU])."""
    item = tl.program_id(0) + (s // STEPS) * tl.num_programs(0)
    token = item // n_tiles
    rows = (item % n_tiles) * BN + tl.arange(0, BN)
    g = (s % STEPS) * NU + tl.arange(0, NU)
    j = g // N_UNITS
    blk = g % N_UNITS
    um = index >= 0
    bm = um[:, None] & (rows < n_out)[None, :]
    base = (tl.maximum(index, 0).to(tl.int64) * stride_d)[:, None] + (rows.to(tl.int64) * row_bytes)[None, :]
    x_at = h + (token * TOP_K + j).to(tl.int64) * K + blk * UNIT_W
    return base, blk, bm, x_at, um


@triton.jit
def _stream_down_kernel(h, ids, topk_w, slot_of, wd, y, n_out, stride_d, row_bytes, n_items,
                        TOP_K: tl.constexpr, K: tl.constexpr, FMT: tl.constexpr, N_UNITS: tl.constexpr,
                        UNIT_W: tl.constexpr, NT: tl.constexpr, SLOTS: tl.constexpr, BN: tl.constexpr,
                        NU: tl.constexpr, BLOCK_HALVES: tl.constexpr):
    """y[token, rows] = sum over chosen experts j and their units of w[token, j] * (unit's rows . h[token, j]'s
    slice), for the items (token, row tile) pid, pid + programs, ...; pipelined as the gate/up kernel."""
    STEPS: tl.constexpr = (TOP_K * N_UNITS + NU - 1) // NU
    n_tiles = (n_out + BN - 1) // BN
    pid = tl.program_id(0)
    total = (n_items - pid + tl.num_programs(0) - 1) // tl.num_programs(0) * STEPS
    t = tl.arange(0, NT)
    index, weight_next = _down_route(0, total, ids, topk_w, slot_of, n_tiles, TOP_K, N_UNITS, SLOTS, NU, STEPS)
    base, blk, bm, x_at, um = _down_where(0, index, h, stride_d, row_bytes, n_out, n_tiles, TOP_K, K, N_UNITS,
                                          UNIT_W, BN, NU, STEPS)
    n_w, n_0, n_1, n_2, n_3 = fetch_words(FMT, wd, base, blk, t, bm, BLOCK_HALVES)
    xa_next, xb_next = fetch_x(FMT, x_at, t, um)
    index, weight_after = _down_route(1, total, ids, topk_w, slot_of, n_tiles, TOP_K, N_UNITS, SLOTS, NU, STEPS)
    acc = tl.zeros((NU, BN, NT), tl.float32)
    for s in range(0, total):
        c_w, c_0, c_1, c_2, c_3, xa, xb, weight = n_w, n_0, n_1, n_2, n_3, xa_next, xb_next, weight_next
        base, blk, bm, x_at, um = _down_where(s + 1, index, h, stride_d, row_bytes, n_out, n_tiles, TOP_K, K,
                                              N_UNITS, UNIT_W, BN, NU, STEPS)
        n_w, n_0, n_1, n_2, n_3 = fetch_words(FMT, wd, base, blk, t, bm, BLOCK_HALVES)
        xa_next, xb_next = fetch_x(FMT, x_at, t, um)
        weight_next = weight_after
        index, weight_after = _down_route(s + 2, total, ids, topk_w, slot_of, n_tiles, TOP_K, N_UNITS, SLOTS, NU,
                                          STEPS)
        units = ((s % STEPS) * NU + tl.arange(0, NU)) % N_UNITS
        acc += step_dot(FMT, c_w, c_0, c_1, c_2, c_3, xa, xb, units) * weight[:, None, None]
        if s % STEPS == STEPS - 1:
            item = pid + (s // STEPS) * tl.num_programs(0)
            rows = (item % n_tiles) * BN + tl.arange(0, BN)
            out = tl.sum(tl.sum(acc, axis=2), axis=0)
            tl.store(y + (item // n_tiles).to(tl.int64) * n_out + rows, out, mask=rows < n_out)
            acc = tl.zeros((NU, BN, NT), tl.float32)


def stream_applies(spec, *byte_offsets: int) -> bool:
    """A format these kernels read, every block start aligned for its words (2 bytes; Q4_K: 4)."""
    align = 4 if spec.name == "Q4_K" else 2
    return spec.name in STREAM_FORMATS and all(offset % align == 0 for offset in byte_offsets)


def _constants(spec, n_in: int, top_k: int, slots: bool, bn: int, nu: int) -> dict:
    from strata.kernels.moe.wide_gemv import UNIT, WORDS

    return dict(TOP_K=top_k, K=n_in, FMT=spec.fmt_id, N_UNITS=n_in // UNIT[spec.name], UNIT_W=UNIT[spec.name],
                NT=WORDS[spec.name], SLOTS=slots, BN=bn, NU=nu, BLOCK_HALVES=STREAM_FORMATS[spec.name])


def launch_stream_gate_up(x, topk_ids, g, u, slot_of, hid, spec, bn: int, nu: int, warps: int, per_sm: int):
    """`_stream_gate_up_kernel` over operands g, u (gemv.ExpertOperand) into H [T, k, ff]: gate_up_swiglu's
    contract."""
    n_tokens, top_k = topk_ids.shape
    n_items = n_tokens * top_k * triton.cdiv(g.rows, bn)
    slots = slot_of is not None
    _stream_gate_up_kernel[(stream_grid(x.device, per_sm, n_items),)](
        x.contiguous(), topk_ids.contiguous(), slot_of if slots else topk_ids, g.raw, u.raw, hid, g.rows, g.stride,
        u.stride, g.row_bytes, n_items, **_constants(spec, g.cols, top_k, slots, bn, nu), num_warps=warps)
    return hid


def launch_stream_down(h, topk_ids, topk_weights, d, slot_of, y, spec, bn: int, nu: int, warps: int, per_sm: int):
    """`_stream_down_kernel` over operand d into y [T, d.rows]: the down kernel's contract (and the dense matvec's)."""
    n_tokens, top_k = topk_ids.shape
    n_items = n_tokens * triton.cdiv(d.rows, bn)
    slots = slot_of is not None
    _stream_down_kernel[(stream_grid(h.device, per_sm, n_items),)](
        h, topk_ids.contiguous(), topk_weights.contiguous(), slot_of if slots else topk_ids, d.raw, y, d.rows,
        d.stride, d.row_bytes, n_items, **_constants(spec, d.cols, top_k, slots, bn, nu), num_warps=warps)
    return y
