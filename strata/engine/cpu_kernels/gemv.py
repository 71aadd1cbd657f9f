"""y = x @ W^T of GGUF-format matrices, and SwiGLU's fused gate/up, over "pairs" of (expert, input row).

Pairs are grouped by expert: `pair_start[j]` .. `pair_start[j + 1]` belong to `experts[j]` and read activation
row `x_rows[p]`.
"""

from __future__ import annotations

import threading

import numpy as np

from strata.engine.cpu_kernels.activations import Activations, quantize_rows
from strata.engine.cpu_kernels.blocks import FORMATS, FP16, gate_up_rows, gemv_rows
from strata.engine.cpu_kernels.simd_pool import FORMATS8, ISA, Q_MAX, gate_up_simd_rows, gemv_simd_rows, quantize_codes
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


# The SIMD kernels (`simd_pool`): the pool's default for every format they take; `act` "i16" or "i8".


def simd_supported(ggml_type: int) -> bool:
    return ISA is not None and int(ggml_type) in FORMATS8


def simd_groups(ggml_type: int) -> tuple[int, int]:
    """(activation group, interleave) of a format the SIMD kernels read."""
    return LAYOUT[FORMATS8[int(ggml_type)][1]][2:]


class Scratch(threading.local):
    """Buffers the SIMD path reuses from call to call, one set per thread, grown when a call needs more rows."""

    def __init__(self):
        self.arrays: dict[tuple, np.ndarray] = {}

    def get(self, name: str, rows: int, cols: int, dtype) -> np.ndarray:
        key = (name, cols, np.dtype(dtype).str)
        a = self.arrays.get(key)
        if a is None or a.shape[0] < rows:
            a = self.arrays[key] = np.empty((max(rows, 8), cols), dtype)
        return a[:rows]


def _new(name: str, rows: int, cols: int, dtype, scratch: Scratch | None) -> np.ndarray:
    return scratch.get(name, rows, cols, dtype) if scratch is not None else np.empty((rows, cols), dtype)


def quantize_simd(ggml_type: int, x: np.ndarray, act: str, scratch: Scratch | None = None) -> Activations:
    """float32 [R, n] -> int16 / int8 codes in the format's activation groups (steps, code sums per group); in
    `scratch`'s buffers when given (valid until this thread's next call with the same shape)."""
    group, interleave = simd_groups(ggml_type)
    x = np.ascontiguousarray(x, dtype=np.float32)
    (rows, n), name = x.shape, f"act{group}.{interleave}"
    act_rows = Activations(_new(name + "q", rows, n, np.int16 if act == "i16" else np.int8, scratch),
                           _new(name + "s", rows, n // group, np.float32, scratch),
                           _new(name + "t", rows, n // group, np.int32, scratch))
    quantize_codes(x, group, interleave, Q_MAX[act], act_rows.q, act_rows.step, act_rows.sums)
    return act_rows


def simd_gemv_pairs(ggml_type: int, w: np.ndarray, act: Activations, experts, pair_start, x_rows) -> np.ndarray:
    """As `gemv_pairs`, with activations from `quantize_simd`."""
    experts, pair_start, x_rows = _args(experts, pair_start, x_rows)
    y = np.empty((x_rows.shape[0], w.shape[1]), np.float32)
    with _ONE_AT_A_TIME:
        gemv_simd_rows(FORMATS8[int(ggml_type)][0], w, experts, pair_start, x_rows, act.q, act.step, act.sums, FP16, y)
    return y


def simd_gate_up_pairs(gate_type: int, w_gate: np.ndarray, up_type: int, w_up: np.ndarray, act: Activations, experts,
                       pair_start, x_rows, scratch: Scratch | None = None) -> np.ndarray:
    """As `gate_up_pairs`, one activation copy for both (gate and up must share `simd_groups`); the result in
    `scratch`'s buffers when given."""
    experts, pair_start, x_rows = _args(experts, pair_start, x_rows)
    h = _new("h", x_rows.shape[0], w_gate.shape[1], np.float32, scratch)
    u = _new("u", x_rows.shape[0], w_gate.shape[1], np.float32, scratch)
    with _ONE_AT_A_TIME:
        gate_up_simd_rows(FORMATS8[int(gate_type)][0], w_gate, FORMATS8[int(up_type)][0], w_up, experts, pair_start,
                          x_rows, act.q, act.step, act.sums, FP16, h, u)
    return h


def simd_gemv(ggml_type: int, w: np.ndarray, x: np.ndarray, act: str = "i16") -> np.ndarray:
    """One matrix through the SIMD kernels: w uint8 [out, row_bytes], x float32 [T, in] -> float32 [T, out]."""
    t = x.shape[0]
    return simd_gemv_pairs(ggml_type, w[None], quantize_simd(ggml_type, x, act), [0], [0, t], np.arange(t))
