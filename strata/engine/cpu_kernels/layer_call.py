"""One layer's missed experts in ONE native call: pairs from the routing ids, activation codes, gate/up + SwiGLU,
codes of h, down, and the weighted sum into the output, all inside one numba function with its buffers kept from
call to call. No torch, no Python between the steps: what the pool pays per layer beyond the weight bytes is one
dispatch and two parallel regions (numba's threads, woken once for gate/up and once for down).

The arithmetic is `swiglu.moe_experts`'s SIMD path step for step (the same row functions on the same codes, the pairs
in the same order, summed in the same order), so it gives the same bytes and keeps its float64 bound.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from strata.engine.cpu_kernels.blocks import FP16
from strata.engine.cpu_kernels.gemv import _ONE_AT_A_TIME
from strata.engine.cpu_kernels.simd_ir import LAYOUT
from strata.engine.cpu_kernels.simd_pool import FORMATS8, Q_MAX, gate_up_simd_rows, gemv_simd_rows, quantize_codes


@njit(nogil=True, cache=True)
def routed_pairs(ids, weights, experts, pair_start, pair_token, pair_weight):
    """Pairs of `experts` (in their order) from ids int64 [T, k] and weights float32 [T, k]: for each expert its
    tokens in ascending order (slots ascending within a token, as `(ids == e).nonzero()`), in place. The count."""
    p = 0
    for j in range(experts.shape[0]):
        pair_start[j] = p
        for t in range(ids.shape[0]):
            for s in range(ids.shape[1]):
                if ids[t, s] == experts[j]:
                    pair_token[p] = t
                    pair_weight[p] = weights[t, s]
                    p += 1
    pair_start[experts.shape[0]] = p
    return p


@njit(parallel=True, nogil=True, cache=True)
def layer_experts(fmt_g, w_g, fmt_u, w_u, fmt_d, w_d, q_max, group, interleave, group_h, interleave_h, x, ids, weights,
                  experts, tab, pair_start, pair_token, pair_weight, pair_rows, qx, sx, tx, h, u, qh, sh, th, y, out, done,
                  seq):
    """out float32 [T, embd] (zeroed here) = sum over pairs of weight * expert(x[token]); buffers sized by the
    caller (`LayerBuffers`): qx/sx/tx >= T rows, h/u/qh/sh/th/y >= T * k rows. Last, done[0] = seq (`done_flag`)."""
    n_pairs = routed_pairs(ids, weights, experts, pair_start, pair_token, pair_weight)
    out[:] = 0
    if n_pairs == 0:
        done[0] = seq
        return
    quantize_codes(x, group, interleave, q_max, qx, sx, tx)
    # gate and up of a chunk back to back, SwiGLU in place: the pool's own kernel, one parallel region
    gate_up_simd_rows(fmt_g, w_g, fmt_u, w_u, experts, pair_start, pair_token, qx, sx, tx, tab, h, u)
    quantize_codes(h[:n_pairs], group_h, interleave_h, q_max, qh, sh, th)
    # down: pair p's codes are row p of qh (pair_rows: the identity), the pool's own kernel again
    gemv_simd_rows(fmt_d, w_d, experts, pair_start, pair_rows, qh, sh, th, tab, y)
    n_embd = w_d.shape[1]
    for p in range(n_pairs):  # in pair order, as `swiglu.add_weighted_rows`
        r = pair_token[p]
        for i in range(n_embd):
            out[r, i] += y[p, i] * pair_weight[p]
    done[0] = seq  # after every store to out (the stores may alias, so the compiler keeps their order)


class LayerBuffers:
    """The buffers of `layer_experts` for one shape (embd, ff, formats, activation width), grown when a call has
    more rows or experts than any before; owned by one caller thread (the pool's worker)."""

    def __init__(self, types: tuple[int, int, int], embd: int, ff: int, act: str):
        self.codes = [FORMATS8[t][0] for t in types]
        (self.group, self.interleave), (self.group_h, self.interleave_h) = (LAYOUT[FORMATS8[types[0]][1]][2:],
                                                                            LAYOUT[FORMATS8[types[2]][1]][2:])
        self.embd, self.ff, self.act = embd, ff, act
        self.q_max, self.code_type = Q_MAX[act], np.int16 if act == "i16" else np.int8
        self.rows = self.pairs = self.experts = 0
        self.no_flag = np.zeros(1, np.int64)  # the flag of a call nobody waits on

    def ensure(self, rows: int, pairs: int, experts: int) -> None:
        if rows > self.rows:
            self.rows = max(rows, 4)
            self.qx = np.empty((self.rows, self.embd), self.code_type)
            self.sx = np.empty((self.rows, self.embd // self.group), np.float32)
            self.tx = np.empty(self.sx.shape, np.int32)
        if pairs > self.pairs:
            self.pairs = max(pairs, 16)
            n, ff = self.pairs, self.ff
            self.h, self.u, self.y = (np.empty((n, ff), np.float32), np.empty((n, ff), np.float32),
                                      np.empty((n, self.embd), np.float32))
            self.qh = np.empty((n, ff), self.code_type)
            self.sh = np.empty((n, ff // self.group_h), np.float32)
            self.th = np.empty(self.sh.shape, np.int32)
            self.pair_token, self.pair_weight = np.empty(n, np.int64), np.empty(n, np.float32)
            self.pair_rows = np.arange(n, dtype=np.int64)
        if experts + 1 > self.experts:
            self.experts = max(experts + 1, 16)
            self.pair_start = np.empty(self.experts, np.int64)

    def run(self, views, x: np.ndarray, ids: np.ndarray, weights: np.ndarray, experts: np.ndarray,
            out: np.ndarray, done: np.ndarray | None = None, seq: int = 0) -> None:
        """out [T, embd] = the experts' weighted sum for x float32 [T, embd], ids int64 / weights float32 [T, k];
        then done[0] = seq (int64 [1], when given)."""
        self.ensure(x.shape[0], ids.size, experts.shape[0])
        (fg, fu, fd), (wg, wu, wd) = self.codes, views
        with _ONE_AT_A_TIME:  # numba's workqueue layer aborts on parallel calls from two threads (two pools)
            layer_experts(fg, wg, fu, wu, fd, wd, self.q_max, self.group, self.interleave, self.group_h,
                          self.interleave_h, x, ids, weights, experts, FP16, self.pair_start, self.pair_token,
                          self.pair_weight, self.pair_rows, self.qx, self.sx, self.tx, self.h, self.u, self.qh,
                          self.sh, self.th, self.y, out, self.no_flag if done is None else done, seq)
