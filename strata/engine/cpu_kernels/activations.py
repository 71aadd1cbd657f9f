"""Activations as the block kernels read them: int16 codes with one float32 step per group of a weight block.

Each group of G inputs (G = 32, or 64 for Q2_0) is stored as q = rint(x / dx) with dx = amax / 32767, so every
input is within `INPUT_ERROR * dx` of dx * q. The integer dot products of a block are then exact, and a GEMV
differs from float64 by at most sum_j |W_ij| * INPUT_ERROR * dx(j), plus float32 rounding of the block sums
(`ACCUMULATION_ERROR` times sum_j |W_ij x_j|). int16 rather than int8 costs the same vector instruction (a
16-bit multiply-add) and makes that bound ~256x tighter: about 2e-5 of a typical output, against ~5e-3 for int8.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

Q_MAX = 32767
INPUT_ERROR = 0.51  # half a step, and the float32 rounding of x / dx (at most 32767 * 2^-24 of a step)
ACCUMULATION_ERROR = 1e-5  # float32 sums over at most a few hundred blocks (n_blocks * 2^-24, with margin)


@dataclass
class Activations:
    """Rows of quantized inputs: q int16 [R, n], step float32 [R, n / G], sums int32 [R, n / G] (sum of q per group)."""

    q: np.ndarray
    step: np.ndarray
    sums: np.ndarray


def quantize_rows(x: np.ndarray, group: int, interleave: int = 1) -> Activations:
    """float32 [R, n] -> int16 codes per group. `interleave` k reorders each group as the weights are packed when
    a byte carries k consecutive weights (Q2_0: k = 4): position p * (G/k) + i holds input i * k + p."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, n = x.shape
    g = x.reshape(rows, n // group, group)
    step = np.abs(g).max(axis=-1) / np.float32(Q_MAX)
    inv = np.divide(np.float32(1), step, out=np.zeros_like(step), where=step > 0)
    q = np.clip(np.rint(g * inv[..., None]), -Q_MAX, Q_MAX).astype(np.int16)
    sums = q.sum(axis=-1, dtype=np.int32)
    if interleave > 1:
        q = q.reshape(rows, n // group, group // interleave, interleave).swapaxes(-1, -2)
    return Activations(np.ascontiguousarray(q.reshape(rows, n)), step, sums)


def input_error(x: np.ndarray, group: int, q_max: int = Q_MAX) -> np.ndarray:
    """The bound on |x - dx * q| for each input of float [R, n] as `quantize_rows` stores it (q_max 32767), or as
    `int8_act.quantize8` does (q_max 127), float64 [R, n]."""
    g = np.abs(np.asarray(x, dtype=np.float64)).reshape(x.shape[0], -1, group)
    step = g.max(axis=-1, keepdims=True) / q_max
    return np.broadcast_to(INPUT_ERROR * step, g.shape).reshape(x.shape)
