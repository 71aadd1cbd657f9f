"""y = x @ W^T of GGUF-format matrices, and SwiGLU's fused gate/up, over "pairs" of (expert, input row).

Pairs are grouped by expert: `pair_start[j]` .. `pair_start[j + 1]` belong to `experts[j]` and read activation
row `x_rows[p]`.
"""

from __future__ import annotations

import threading

import numpy as np

from strata.engine.cpu_kernels.activations import Activations, quantize_rows
from strata.engine.cpu_kernels.blocks import FORMATS, FP16, gate_up_rows, gemv_rows
from strata.engine.cpu_kernels.int8_act import FORMATS8, gate_up8_rows, gemv8_rows, quantize8
from strata.engine.cpu_kernels.simd_ir import LAYOUT


# numba's fallback threading layer (workqueue) aborts on concurrent parallel calls; two pools (two engines in one
# process) must take turns, and would only oversubscribe the cores otherwise.
_ONE_AT_A_TIME = threading.Lock()


def supported(ggml_type: int) -> bool:
    return int(ggml_type) in FORMATS


def quantize_for(ggml_type: int, x: np.ndarray) -> Activations:
    _, group, interleave = FORMATS[int(ggml_type)]
    return quantize_rows(x, group, interleave)


def _args(experts, pair_start, x_rows):
    return (np.ascontiguousarray(experts, dtype=np.int64), np.ascontiguousarray(pair_start, dtype=np.int64),
            np.ascontiguousarray(x_rows, dtype=np.int64))


def gemv_pairs(ggml_type: int, w: np.ndarray, act: Activations, experts, pair_start, x_rows) -> np.ndarray:
    """w uint8 [E, out, row_bytes] -> float32 [P, out]: pair p of expert j is x[x_rows[p]] @ w[experts[j]]^T."""
    experts, pair_start, x_rows = _args(experts, pair_start, x_rows)
    y = np.empty((x_rows.shape[0], w.shape[1]), np.float32)
    with _ONE_AT_A_TIME:
        gemv_rows(FORMATS[int(ggml_type)][0], w, experts, pair_start, x_rows, act.q, act.step, act.sums, FP16, y)
    return y


def gate_up_pairs(gate_type: int, w_gate: np.ndarray, act_gate: Activations, up_type: int, w_up: np.ndarray,
                  act_up: Activations, experts, pair_start, x_rows) -> np.ndarray:
    """silu(x @ gate^T) * (x @ up^T) for every pair, float32 [P, ff]."""
    experts, pair_start, x_rows = _args(experts, pair_start, x_rows)
    h = np.empty((x_rows.shape[0], w_gate.shape[1]), np.float32)
    with _ONE_AT_A_TIME:
        gate_up_rows(FORMATS[int(gate_type)][0], w_gate, act_gate.q, act_gate.step, act_gate.sums,
                     FORMATS[int(up_type)][0], w_up, act_up.q, act_up.step, act_up.sums, experts, pair_start, x_rows,
                     FP16, h)
    return h


def gemv(ggml_type: int, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """One matrix: w uint8 [out, row_bytes] in its GGUF blocks, x float32 [T, in] -> float32 [T, out]."""
    t = x.shape[0]
    return gemv_pairs(ggml_type, w[None], quantize_for(ggml_type, x), [0], [0, t], np.arange(t))


# The int8-activation kernels (`int8_act`): the default for every format they take, unless STRATA_CPU_POOL_INT16.


def int8_supported(ggml_type: int) -> bool:
    return int(ggml_type) in FORMATS8


def quantize8_for(ggml_type: int, x: np.ndarray) -> Activations:
    """float32 [R, n] -> int8 codes in the format's activation groups (steps float32, code sums int32 per group)."""
    group, interleave = LAYOUT[FORMATS8[int(ggml_type)][1]][2:]
    x = np.ascontiguousarray(x, dtype=np.float32)
    act = Activations(np.empty(x.shape, np.int8), np.empty((x.shape[0], x.shape[1] // group), np.float32),
                      np.empty((x.shape[0], x.shape[1] // group), np.int32))
    quantize8(x, group, interleave, act.q, act.step, act.sums)
    return act


def gemv8_pairs(ggml_type: int, w: np.ndarray, act: Activations, experts, pair_start, x_rows) -> np.ndarray:
    """As `gemv_pairs`, with int8 activations from `quantize8_for`."""
    experts, pair_start, x_rows = _args(experts, pair_start, x_rows)
    y = np.empty((x_rows.shape[0], w.shape[1]), np.float32)
    with _ONE_AT_A_TIME:
        gemv8_rows(FORMATS8[int(ggml_type)][0], w, experts, pair_start, x_rows, act.q, act.step, act.sums, FP16, y)
    return y


def gate_up8_pairs(gate_type: int, w_gate: np.ndarray, up_type: int, w_up: np.ndarray, act: Activations, experts,
                   pair_start, x_rows) -> np.ndarray:
    """As `gate_up_pairs`, one int8 activation copy for both (gate and up must share their activation groups)."""
    experts, pair_start, x_rows = _args(experts, pair_start, x_rows)
    h = np.empty((x_rows.shape[0], w_gate.shape[1]), np.float32)
    u = np.empty_like(h)
    with _ONE_AT_A_TIME:
        gate_up8_rows(FORMATS8[int(gate_type)][0], w_gate, FORMATS8[int(up_type)][0], w_up, experts, pair_start,
                      x_rows, act.q, act.step, act.sums, FP16, h, u)
    return h


def gemv8(ggml_type: int, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """One matrix with int8 activations: w uint8 [out, row_bytes], x float32 [T, in] -> float32 [T, out]."""
    t = x.shape[0]
    return gemv8_pairs(ggml_type, w[None], quantize8_for(ggml_type, x), [0], [0, t], np.arange(t))
