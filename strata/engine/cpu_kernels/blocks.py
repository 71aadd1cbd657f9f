"""Dot products of one weight row in its GGUF block bytes with int16 activations (see `activations`), in numba.

The weights are never made float: each block's codes meet the activations' int16 codes in an exact int32 sum,
and only that sum is scaled in float32 (by the block's scales and the activation group's step). The loops are
written so that LLVM vectorizes them (one pass over the block's bytes, every code pulled out by constant shifts).

A format is listed in FORMATS by ggml type id: (code for the dispatch below, activation group G, interleave).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from strata.quant.registry import Q2_0_TYPE

Q8_0, Q4_0, Q4_K, Q6_K, Q2_0 = 0, 1, 2, 3, 4
FORMATS = {8: (Q8_0, 32, 1), 2: (Q4_0, 32, 1), 12: (Q4_K, 32, 1), 14: (Q6_K, 32, 1), Q2_0_TYPE: (Q2_0, 64, 4)}

# Every fp16 bit pattern as float32: one table lookup per scale.
FP16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


@njit(inline="always")
def _fp16(row, at, f16):
    return f16[np.int32(row[at]) | (np.int32(row[at + 1]) << 8)]


# LLVM vectorizes a block loop only when its body is big enough not to be fully unrolled first; the 32-weight
# formats therefore take two blocks per pass (an odd last block runs alone, unvectorized).


@njit(inline="always")
def _q8_0_sum(codes, xs):
    """Sum of (c ^ 128) * x: the signed code plus 128, an unsigned byte, so no sign extension stands in the way."""
    s = np.int32(0)
    for i in range(32):
        s = np.int32(s + np.int32(codes[i] ^ 128) * np.int32(xs[i]))
    return s


@njit(inline="always")
def _dot_q8_0(row, q, step, sums, f16):
    """34-byte blocks: fp16 d, 32 int8 codes; w = d * c."""
    total = np.float32(0)
    n = step.shape[0]
    for b in range(0, n - 1, 2):
        c0, c1 = row[b * 34 + 2 : b * 34 + 34], row[b * 34 + 36 : b * 34 + 68]
        xs = q[b * 32 : b * 32 + 64]
        s0 = np.int32(0)
        s1 = np.int32(0)
        for i in range(32):
            s0 = np.int32(s0 + np.int32(c0[i] ^ 128) * np.int32(xs[i]))
            s1 = np.int32(s1 + np.int32(c1[i] ^ 128) * np.int32(xs[32 + i]))
        total += _fp16(row, b * 34, f16) * step[b] * np.float32(s0 - 128 * sums[b])
        total += _fp16(row, b * 34 + 34, f16) * step[b + 1] * np.float32(s1 - 128 * sums[b + 1])
    if n % 2:
        b = n - 1
        s = _q8_0_sum(row[b * 34 + 2 : b * 34 + 34], q[b * 32 : b * 32 + 32])
        total += _fp16(row, b * 34, f16) * step[b] * np.float32(s - 128 * sums[b])
    return total


@njit(inline="always")
def _q4_0_sum(codes, xs):
    s = np.int32(0)
    for i in range(16):
        c = np.int32(codes[i])
        s = np.int32(s + np.int32(np.int32(c & 15) * np.int32(xs[i]) + np.int32(c >> 4) * np.int32(xs[16 + i])))
    return s


@njit(inline="always")
def _dot_q4_0(row, q, step, sums, f16):
    """18-byte blocks: fp16 d, 16 bytes whose low nibbles are weights 0-15, high 16-31; w = d * (c - 8)."""
    total = np.float32(0)
    n = step.shape[0]
    for b in range(0, n - 1, 2):
        c0, c1 = row[b * 18 + 2 : b * 18 + 18], row[b * 18 + 20 : b * 18 + 36]
        xs = q[b * 32 : b * 32 + 64]
        s0 = np.int32(0)
        s1 = np.int32(0)
        for i in range(16):
            a, c = np.int32(c0[i]), np.int32(c1[i])
            s0 = np.int32(s0 + np.int32(np.int32(a & 15) * np.int32(xs[i]) + np.int32(a >> 4) * np.int32(xs[16 + i])))
            s1 = np.int32(s1 + np.int32(np.int32(c & 15) * np.int32(xs[32 + i]) + np.int32(c >> 4) * np.int32(xs[48 + i])))
        total += _fp16(row, b * 18, f16) * step[b] * np.float32(s0 - 8 * sums[b])
        total += _fp16(row, b * 18 + 18, f16) * step[b + 1] * np.float32(s1 - 8 * sums[b + 1])
    if n % 2:
        b = n - 1
        s = _q4_0_sum(row[b * 18 + 2 : b * 18 + 18], q[b * 32 : b * 32 + 32])
        total += _fp16(row, b * 18, f16) * step[b] * np.float32(s - 8 * sums[b])
    return total


@njit(inline="always")
def _dot_q2_0(row, q, step, sums, f16):
    """18-byte blocks of 64: fp16 d, 16 bytes each carrying 4 consecutive 2-bit codes; w = d * (c - 1).
    The activations are interleaved to match: group position p * 16 + i holds input 4 * i + p."""
    total = np.float32(0)
    for b in range(step.shape[0]):
        codes = row[b * 18 + 2 : b * 18 + 18]
        xs = q[b * 64 : b * 64 + 64]
        s = np.int32(0)
        for i in range(16):
            c = np.int32(codes[i])
            s = np.int32(s + np.int32(c & 3) * np.int32(xs[i]) + np.int32((c >> 2) & 3) * np.int32(xs[16 + i])
                         + np.int32((c >> 4) & 3) * np.int32(xs[32 + i]) + np.int32(c >> 6) * np.int32(xs[48 + i]))
        total += _fp16(row, b * 18, f16) * step[b] * np.float32(s - sums[b])
    return total


@njit(inline="always")
def _scale_min(scales, j):
    """Q4_K's 6-bit scale and min of sub-block j from its 12 packed bytes."""
    if j < 4:
        return np.int32(scales[j] & 63), np.int32(scales[j + 4] & 63)
    sc = np.int32(scales[j + 4] & 15) | np.int32((scales[j - 4] >> 6) << 4)
    m = np.int32(scales[j + 4] >> 4) | np.int32((scales[j] >> 6) << 4)
    return sc, m


@njit(inline="always")
def _dot_q4_k(row, q, step, sums, f16):
    """144-byte super-blocks of 256: fp16 d, fp16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles (32
    bytes per pair of 32-weight sub-blocks: low nibbles the first, high the second); w = d*sc*c - dmin*m."""
    total = np.float32(0)
    for b in range(step.shape[0] // 8):
        at = b * 144
        d, dmin = _fp16(row, at, f16), _fp16(row, at + 2, f16)
        scales = row[at + 4 : at + 16]
        for pair in range(4):
            codes = row[at + 16 + 32 * pair : at + 48 + 32 * pair]
            g = b * 8 + 2 * pair
            xs = q[g * 32 : g * 32 + 64]
            s0 = np.int32(0)
            s1 = np.int32(0)
            for i in range(32):
                c = np.int32(codes[i])
                s0 = np.int32(s0 + np.int32(c & 15) * np.int32(xs[i]))
                s1 = np.int32(s1 + np.int32(c >> 4) * np.int32(xs[32 + i]))
            sc0, m0 = _scale_min(scales, 2 * pair)
            sc1, m1 = _scale_min(scales, 2 * pair + 1)
            total += step[g] * (d * np.float32(sc0) * np.float32(s0) - dmin * np.float32(m0) * np.float32(sums[g]))
            total += step[g + 1] * (d * np.float32(sc1) * np.float32(s1) - dmin * np.float32(m1) * np.float32(sums[g + 1]))
    return total


@njit(inline="always")
def _dot_q6_k(row, q, step, f16):
    """210-byte super-blocks of 256: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales (one per 16
    weights), fp16 d; w = d * sc * (c - 32). Weight h*128 + p*32 + i (p < 4, i < 32) takes the nibble p // 2 of
    byte h*64 + (p % 2)*32 + i and bits 2p, 2p+1 of byte 128 + h*32 + i."""
    total = np.float32(0)
    for b in range(step.shape[0] // 8):
        at = b * 210
        d = _fp16(row, at + 208, f16)
        for h in range(2):
            high = row[at + 128 + h * 32 : at + 160 + h * 32]
            for p in range(4):
                low = row[at + h * 64 + (p % 2) * 32 : at + h * 64 + (p % 2) * 32 + 32]
                g = b * 8 + h * 4 + p
                xs = q[g * 32 : g * 32 + 32]
                lo_shift, hi_shift = 4 * (p // 2), 2 * p
                s0 = np.int32(0)
                s1 = np.int32(0)
                for i in range(16):
                    c0 = np.int32(((low[i] >> lo_shift) & 15) | (((high[i] >> hi_shift) & 3) << 4)) - 32
                    c1 = np.int32(((low[16 + i] >> lo_shift) & 15) | (((high[16 + i] >> hi_shift) & 3) << 4)) - 32
                    s0 = np.int32(s0 + np.int32(c0) * np.int32(xs[i]))
                    s1 = np.int32(s1 + np.int32(c1) * np.int32(xs[16 + i]))
                sc = at + 192 + h * 8 + p * 2
                sc0 = np.float32(np.int32(row[sc] ^ 128) - 128)
                sc1 = np.float32(np.int32(row[sc + 1] ^ 128) - 128)
                total += step[g] * d * (sc0 * np.float32(s0) + sc1 * np.float32(s1))
    return total


@njit(inline="always")
def row_dot(fmt, row, q, step, sums, f16):
    """sum_j w_j x_j over one row: row uint8 [row_bytes]; q int16 [n]; step float32, sums int32 [n / G]."""
    if fmt == Q2_0:
        return _dot_q2_0(row, q, step, sums, f16)
    if fmt == Q4_K:
        return _dot_q4_k(row, q, step, sums, f16)
    if fmt == Q8_0:
        return _dot_q8_0(row, q, step, sums, f16)
    if fmt == Q6_K:
        return _dot_q6_k(row, q, step, f16)
    return _dot_q4_0(row, q, step, sums, f16)


# The parallel drivers live in this file because numba's cache checks only the file of the function it compiles:
# a driver elsewhere would keep running stale code after an edit here.
# Each weight row is read from memory once and used for every pair of its expert while it sits in L1; numba's
# threads split the rows, and the GIL is released throughout so the caller's other threads keep running.


@njit(parallel=True, nogil=True, cache=True)
def gemv_rows(fmt, w, experts, pair_start, x_rows, q, step, sums, f16, y):
    n_out = w.shape[1]
    for r in prange(experts.shape[0] * n_out):
        j = r // n_out
        o = r - j * n_out
        row = w[experts[j], o]
        for p in range(pair_start[j], pair_start[j + 1]):
            xr = x_rows[p]
            y[p, o] = row_dot(fmt, row, q[xr], step[xr], sums[xr], f16)


@njit(parallel=True, nogil=True, cache=True)
def gate_up_rows(fmt_g, w_g, q_g, step_g, sums_g, fmt_u, w_u, q_u, step_u, sums_u, experts, pair_start, x_rows, f16, h):
    n_out = w_g.shape[1]
    for r in prange(experts.shape[0] * n_out):
        j = r // n_out
        o = r - j * n_out
        e = experts[j]
        row_g, row_u = w_g[e, o], w_u[e, o]
        for p in range(pair_start[j], pair_start[j + 1]):
            xr = x_rows[p]
            g = row_dot(fmt_g, row_g, q_g[xr], step_g[xr], sums_g[xr], f16)
            u = row_dot(fmt_u, row_u, q_u[xr], step_u[xr], sums_u[xr], f16)
            h[p, o] = g / (np.float32(1) + np.exp(-g)) * u
