"""The SIMD expert kernels: activations quantized once per call to int16 (default) or int8 codes with one float32
step per group (int8 as llama.cpp's q8 blocks), weights read in their GGUF bytes by the row functions of `simd_ir`,
and numba threads splitting chunks of output rows over every expert of the call (not one expert per thread).

Accuracy: each input is within 0.51 * dx of dx * q, dx = amax / q_max of its group (`activations.input_error(x, G,
q_max)`: q_max 32767 for int16, 127 for int8, ~258x looser); the dots are exact in int32 and summed in float32 lanes
(`activations.ACCUMULATION_ERROR`).
"""

from __future__ import annotations

import ctypes

import llvmlite.binding as llvm
import numpy as np
from numba import njit, prange, types

from strata.engine.cpu_kernels.simd_ir import ACTS, LAYOUT, function_name, module
from strata.quant.registry import Q2_0_TYPE

Q_MAX = {"i8": 127, "i16": 32767}
CHUNK = 16  # output rows per work item: 16 weight rows of a 2048-wide Q4_0 matrix are 18 KB, they stay in L1/L2

# ggml type id -> (kernel code for the dispatch below, format name)
FORMATS8 = {8: (0, "Q8_0"), 2: (1, "Q4_0"), 12: (2, "Q4_K"), 14: (3, "Q6_K"), Q2_0_TYPE: (4, "Q2_0")}
_ARGS = [ctypes.c_int64] * 9


def host_isa() -> str:
    """The best variant of `simd_ir` this CPU runs: vnni, avx2 or generic."""
    features = llvm.get_host_cpu_features()
    if features.get("avx2") and features.get("avx512vnni") and features.get("avx512vl"):
        return "vnni"
    return "avx2" if features.get("avx2") and llvm.get_process_triple().startswith("x86_64") else "generic"


_engines: dict[str, object] = {}


def compile_isa(isa: str) -> dict[str, int]:
    """Compile every row function for `isa` (once per process): its name -> its address."""
    if isa not in _engines:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        mod = llvm.parse_assembly(module(isa))
        mod.verify()
        target = llvm.Target.from_triple(llvm.get_process_triple())
        machine = target.create_target_machine(cpu=llvm.get_host_cpu_name(),
                                               features=llvm.get_host_cpu_features().flatten(), opt=3)
        builder = llvm.create_pass_builder(machine, llvm.PipelineTuningOptions(speed_level=3))
        builder.getModulePassManager().run(mod, builder)
        engine = llvm.create_mcjit_compiler(mod, machine)
        engine.finalize_object()
        _engines[isa] = engine  # keeps the code alive
    engine = _engines[isa]
    return {function_name(fmt, act): engine.get_function_address(function_name(fmt, act)) for fmt in LAYOUT
            for act in ACTS}


def row_function(fmt: str, act: str, isa: str):
    """A ctypes handle of one variant (tests call each variant through it)."""
    return ctypes.CFUNCTYPE(None, *_ARGS)(compile_isa(isa)[function_name(fmt, act)])


def _register_host_variant() -> str | None:
    """The drivers below call the host's variant by symbol name, so numba's on-disk cache holds no address. An
    LLVM that rejects a variant's intrinsics falls back to the next one; if none compiles (None), the pool keeps
    the `blocks` kernels."""
    for isa in ("vnni", "avx2", "generic")[("vnni", "avx2", "generic").index(host_isa()):]:
        try:
            addresses = compile_isa(isa)
        except (RuntimeError, AttributeError):  # IR this LLVM rejects; an llvmlite without the new pass manager
            continue
        for name, address in addresses.items():
            llvm.add_symbol(name, address)
        return isa
    return None


ISA = _register_host_variant()

_sig = types.void(*([types.int64] * 9))
_q8_0_i8, _q4_0_i8, _q4_k_i8, _q6_k_i8, _q2_0_i8, _q8_0_i16, _q4_0_i16, _q4_k_i16, _q6_k_i16, _q2_0_i16 = (
    types.ExternalFunction(function_name(f, act), _sig) for act in ACTS for f in ("Q8_0", "Q4_0", "Q4_K", "Q6_K", "Q2_0"))


@njit(inline="always")
def _rows(fmt, wide, w, row_bytes, n_rows, x, n_groups, tab, steps, sums, y):
    """The row function of format code `fmt` (FORMATS8) for int16 activations if `wide`, else int8."""
    if wide:
        if fmt == 0:
            _q8_0_i16(w, row_bytes, n_rows, x, n_groups, tab, steps, sums, y)
        elif fmt == 1:
            _q4_0_i16(w, row_bytes, n_rows, x, n_groups, tab, steps, sums, y)
        elif fmt == 2:
            _q4_k_i16(w, row_bytes, n_rows, x, n_groups, tab, steps, sums, y)
        elif fmt == 3:
            _q6_k_i16(w, row_bytes, n_rows, x, n_groups, tab, steps, sums, y)
        else:
            _q2_0_i16(w, row_bytes, n_rows, x, n_groups, tab, steps, sums, y)
    elif fmt == 0:
        _q8_0_i8(w, row_bytes, n_rows, x, n_groups, tab, steps, sums, y)
    elif fmt == 1:
        _q4_0_i8(w, row_bytes, n_rows, x, n_groups, tab, steps, sums, y)
    elif fmt == 2:
        _q4_k_i8(w, row_bytes, n_rows, x, n_groups, tab, steps, sums, y)
    elif fmt == 3:
        _q6_k_i8(w, row_bytes, n_rows, x, n_groups, tab, steps, sums, y)
    else:
        _q2_0_i8(w, row_bytes, n_rows, x, n_groups, tab, steps, sums, y)


@njit(nogil=True, cache=True)
def quantize_codes(x, group, interleave, q_max, q, step, sums):
    """float32 [R, n] -> q int8 or int16 [R, n], step float32 [R, n / group], sums int32 [R, n / group] (in place),
    q = rint(x / dx) with dx = amax / q_max per group. `interleave` k: position p * (group / k) + i of a group holds
    input i * k + p (as `activations.quantize_rows`)."""
    span = group // interleave
    for r in range(x.shape[0]):
        for g in range(x.shape[1] // group):
            base = g * group
            amax = np.float32(0)
            for i in range(group):
                amax = max(amax, abs(x[r, base + i]))
            dx = amax / np.float32(q_max)
            inv = np.float32(1) / dx if dx > 0 else np.float32(0)
            total = 0
            for i in range(group):
                c = min(max(np.rint(x[r, base + i] * inv), -q_max), q_max)
                total += int(c)
                q[r, base + (i % interleave) * span + i // interleave] = c
            step[r, g] = dx
            sums[r, g] = total


@njit(parallel=True, nogil=True, cache=True)
def gemv_simd_rows(fmt, w, experts, pair_start, x_rows, q, step, sums, tab, y):
    """y [P, out]: pair p of expert j is x[x_rows[p]] @ w[experts[j]]^T; prange over (expert, chunk of CHUNK rows)."""
    n_out = w.shape[1]
    n_chunks = (n_out + CHUNK - 1) // CHUNK
    for t in prange(experts.shape[0] * n_chunks):
        j = t // n_chunks
        o = (t - j * n_chunks) * CHUNK
        nr = min(CHUNK, n_out - o)
        wp = w.ctypes.data + experts[j] * w.strides[0] + o * w.strides[1]
        for p in range(pair_start[j], pair_start[j + 1]):
            xr = x_rows[p]
            _rows(fmt, q.itemsize == 2, wp, w.strides[1], nr, q.ctypes.data + xr * q.strides[0], step.shape[1], tab.ctypes.data,
                  step.ctypes.data + xr * step.strides[0], sums.ctypes.data + xr * sums.strides[0],
                  y.ctypes.data + p * y.strides[0] + o * 4)


@njit(parallel=True, nogil=True, cache=True)
def gate_up_simd_rows(fmt_g, w_g, fmt_u, w_u, experts, pair_start, x_rows, q, step, sums, tab, h, u):
    """h [P, ff] = silu(x @ gate^T) * (x @ up^T), gate and up of a chunk read back to back; u [P, ff] scratch."""
    n_out = w_g.shape[1]
    n_chunks = (n_out + CHUNK - 1) // CHUNK
    for t in prange(experts.shape[0] * n_chunks):
        j = t // n_chunks
        o = (t - j * n_chunks) * CHUNK
        nr = min(CHUNK, n_out - o)
        e = experts[j]
        wg = w_g.ctypes.data + e * w_g.strides[0] + o * w_g.strides[1]
        wu = w_u.ctypes.data + e * w_u.strides[0] + o * w_u.strides[1]
        for p in range(pair_start[j], pair_start[j + 1]):
            xr = x_rows[p]
            xq, xs, xt = (q.ctypes.data + xr * q.strides[0], step.ctypes.data + xr * step.strides[0],
                          sums.ctypes.data + xr * sums.strides[0])
            _rows(fmt_g, q.itemsize == 2, wg, w_g.strides[1], nr, xq, step.shape[1], tab.ctypes.data, xs, xt,
                  h.ctypes.data + p * h.strides[0] + o * 4)
            _rows(fmt_u, q.itemsize == 2, wu, w_u.strides[1], nr, xq, step.shape[1], tab.ctypes.data, xs, xt,
                  u.ctypes.data + p * u.strides[0] + o * 4)
            for i in range(o, o + nr):
                g = h[p, i]
                h[p, i] = g / (np.float32(1) + np.exp(-g)) * u[p, i]
