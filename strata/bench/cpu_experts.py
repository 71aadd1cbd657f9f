"""GB/s of the CPU expert pool on one layer's worth of missed experts (`strata bench cpu-experts`).

For each shape and format, every kernel path of the pool computes the same experts for one token each: the SIMD
kernels with int16 activations (the default) and int8 ones (STRATA_CPU_POOL_INT8), the older `blocks` kernels
(STRATA_CPU_POOL_OLD) and optionally the torch path (dequantize each expert, multiply in float32). Calls cycle
through copies of the layer spanning `--footprint-mb`, so the weights come from DRAM, not a cache. The table gives
expert weight bytes per second beside the host read rate measured the same way (a parallel sum over the same bytes
with the same threads), and each SIMD path's largest error against float64 as a share of its stated bound.

    python -m strata.bench.cpu_experts [--experts 40] [--tokens 1] [--formats Q2_0,Q4_K] [--threads N] [--reps 5]
"""

from __future__ import annotations

import argparse
import sys
import time

import numba
import numpy as np
import torch
from numba import njit, prange

from strata.engine.cpu_kernels import ACCUMULATION_ERROR, HostExperts, input_error, moe_experts, supported
from strata.engine.cpu_kernels.blocks import FORMATS
from strata.engine.cpu_kernels.simd_pool import ISA
from strata.engine.cpu_pool import worker_setup, pool_threads
from strata.engine.experts import ExpertStack, accumulate
from strata.models.weights import QuantWeight
from strata.quant import get_format, random_blocks

# (label, embd, ff, formats of gate/up/down)
SHAPES = [
    ("qwen3moe A3B 2048x768", 2048, 768, [("Q4_K", "Q4_K", "Q6_K"), ("Q8_0",) * 3, ("Q4_0",) * 3, ("Q2_0",) * 3]),
    ("qwen4exp 2560x640", 2560, 640, [("Q2_0",) * 3, ("Q8_0",) * 3]),
]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="strata bench cpu-experts", description=__doc__.split("\n\n")[0])
    p.add_argument("--experts", type=int, default=40, help="missed experts in the layer (default 40)")
    p.add_argument("--tokens", type=int, default=1, help="tokens routed to each expert (default 1)")
    p.add_argument("--formats", default="", help="only these gate formats, comma-separated (e.g. Q2_0,Q4_K)")
    p.add_argument("--threads", type=int, default=0, help="numba threads (default 0: the pool's, every core but one)")
    p.add_argument("--chunksize", type=int, default=0,
                   help="numba's parallel chunk size (default 0: the static split the pool uses; n: dynamic, n at a time)")
    p.add_argument("--footprint-mb", type=int, default=1024,
                   help="the calls cycle through copies of the layer spanning this much memory (default 1024)")
    p.add_argument("--reps", type=int, default=5, help="timed cycles over the copies; the best is reported (default 5)")
    p.add_argument("--row-kernels", action="store_true",
                   help="instead: one core's GB/s of every row kernel (each SIMD variant, int16 / int8, and `blocks`) "
                        "on a 4096 x 2048 matrix that stays in cache, the compute rate that scales with cores")
    p.add_argument("--calls", action="store_true",
                   help="instead: whole pool calls of 1, 3, 10 experts (A3B shape, one token) as decode makes them, "
                        "beside the bytes' floor, with the fixed cost split out (hand-off, prep, dispatch, regions)")
    p.add_argument("--calls-threads", default="",
                   help="with --calls: thread counts to compare, comma-separated (e.g. 1,2; default: --threads)")
    p.add_argument("--calls-spin", default="",
                   help="with --calls: the pool's spin after a call, microseconds, comma-separated (e.g. 0,300,1000)")
    p.add_argument("--calls-gap-us", type=float, default=300.0,
                   help="with --calls: busy waiting before each call, as a decode step's GPU work between layers "
                        "(default 300)")
    p.add_argument("--torch-reps", type=int, default=0, help="timed calls of the torch path (default 0: not run)")
    return p


@njit(parallel=True, nogil=True, fastmath=True, cache=True)
def _sum_words(a):
    """The bytes as float32 words, summed in any order (fastmath lets the loop run in vector lanes)."""
    span = 1 << 14  # words per work item: a 64 KB stretch each, so handing items out costs nothing
    total = np.float32(0)
    for i in prange((a.shape[0] + span - 1) // span):
        total += a[i * span:(i + 1) * span].sum()
    return total


def read_rate(buffers: list[np.ndarray], reps: int) -> float:
    """Bytes/s of a parallel sum over every buffer in turn (numba threads as set): what reading costs at best."""
    words = [b.reshape(-1).view(np.float32) for b in buffers]
    for w in words:
        _sum_words(w)
    n_bytes = sum(b.nbytes for b in buffers)
    return n_bytes / _best(lambda: [_sum_words(w) for w in words], reps)


def _stack(types, n_experts, embd, ff, rng, copies: int = 1) -> ExpertStack:
    """n_experts random experts, repeated `copies` times (expert e of copy c is expert c * n_experts + e)."""
    def matrix(qtype, rows, cols):
        fmt = get_format(qtype)
        raw = random_blocks(qtype, n_experts * rows * cols // fmt.block_size, rng).reshape(n_experts, rows, -1)
        raw = np.tile(raw, (copies, 1, 1))
        return QuantWeight(qtype, fmt.ggml_type, (n_experts * copies, rows, cols), torch.from_numpy(raw))

    return ExpertStack(matrix(types[0], ff, embd), matrix(types[1], ff, embd), matrix(types[2], embd, ff))


def _best(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _error_vs_float64(stack: ExpertStack, types, x: torch.Tensor, routes, weights, experts, out,
                      q_max: int) -> float:
    """Largest error / bound of the kernels' output against float64, for a few experts only (the bound's float64
    products are slow at full size); q_max 32767 for int16 activation codes, 127 for int8."""
    def err_input(v, qtype):
        t = get_format(qtype).ggml_type
        return input_error(v, FORMATS[t][1], q_max) if supported(t) else np.zeros_like(v)

    ref, bound = np.zeros(out.shape), np.zeros(out.shape)
    for e in experts:
        token, slot = routes[e]
        g, u, d = (m[e].dequantize().double().numpy() for m in (stack.gate, stack.up, stack.down))
        xe = x[token].double().numpy()
        gx, ux = xe @ g.T, xe @ u.T
        bg = err_input(xe, types[0]) @ np.abs(g).T + ACCUMULATION_ERROR * (np.abs(xe) @ np.abs(g).T)
        bu = err_input(xe, types[1]) @ np.abs(u).T + ACCUMULATION_ERROR * (np.abs(xe) @ np.abs(u).T)
        silu = gx / (1 + np.exp(-gx))
        h = silu * ux
        dh = 1.1 * bg * (np.abs(ux) + bu) + np.abs(silu) * bu + 1e-6 * np.abs(h)
        hi = np.abs(h) + dh
        b = dh @ np.abs(d).T + err_input(hi, types[2]) @ np.abs(d).T + ACCUMULATION_ERROR * (hi @ np.abs(d).T)
        r = weights[token, slot].double().numpy()[:, None]
        np.add.at(ref, token.numpy(), r * (h @ d.T))
        np.add.at(bound, token.numpy(), r * b)
    return float((np.abs(out.double().numpy() - ref) / bound).max())


PATHS = [("SIMD int16", "i16", 32767), ("SIMD int8", "i8", 127), ("blocks (old)", None, 32767)]


def run_case(label, embd, ff, types, args, rng) -> tuple[str, bool]:
    one = _stack(types, 1, embd, ff, rng)
    layer_bytes = args.experts * one.expert_bytes
    copies = max(1, -(-args.footprint_mb * (1 << 20) // layer_bytes))
    stack = _stack(types, args.experts, embd, ff, rng, copies)
    host = HostExperts(stack.gate, stack.up, stack.down)
    t = args.tokens
    x = torch.randn(t, embd, generator=torch.Generator().manual_seed(0))
    calls = [list(range(c * args.experts, (c + 1) * args.experts)) for c in range(copies)]
    routes = {e: (torch.arange(t), torch.zeros(t, dtype=torch.long)) for e in range(args.experts * copies)}
    weights = torch.full((t, 1), 1.0 / args.experts)
    read = read_rate([v for v in host.views], args.reps) / 1e9
    cells, ok = [], True
    for _, mode, q_max in PATHS:
        host.simd = mode
        for experts in calls:  # compiles (or loads numba's cache) and warms up
            moe_experts(host, x, routes, weights, experts)
        rate = copies * layer_bytes / _best(lambda: [moe_experts(host, x, routes, weights, e) for e in calls],
                                            args.reps) / 1e9
        cells.append(f"{rate:.2f} | {rate / read:.0%}")
        if mode:
            check = calls[0][:4]
            ratio = _error_vs_float64(stack, types, x, routes, weights, check,
                                      moe_experts(host, x, routes, weights, check), q_max)
            ok &= ratio <= 1
            cells[-1] += f" | {ratio:.3f}"
    torch_cell = "-"
    if args.torch_reps:
        ref = torch.zeros_like(x)

        def torch_path():
            ref.zero_()
            accumulate(ref, routes, weights, x, stack.expert, calls[0])

        torch_path()
        torch_cell = f"{layer_bytes / _best(torch_path, args.torch_reps) / 1e9:.3f}"
    line = (f"| {label} | {'/'.join(types)} | {args.experts} x {t} | {layer_bytes / 1e6:.1f} | {read:.1f} | "
            f"{' | '.join(cells)} | {torch_cell} |")
    return line, ok


def row_kernel_table(reps: int) -> None:
    """One thread, one cache-resident matrix per format: GB/s of each row kernel."""
    from strata.engine.cpu_kernels.activations import quantize_rows
    from strata.engine.cpu_kernels.blocks import FP16, gemv_rows
    from strata.engine.cpu_kernels.simd_ir import LAYOUT
    from strata.engine.cpu_kernels.simd_pool import Q_MAX, quantize_codes, row_function

    variants = ["vnni", "avx2", "generic"][["vnni", "avx2", "generic"].index(ISA):] if ISA else []
    numba.set_num_threads(1)
    rng = np.random.default_rng(0)
    n_out, n_in = 4096, 2048
    print("| format | " + " | ".join(f"SIMD {v} {a}" for a in ("int16", "int8") for v in variants) + " | blocks int16 |")
    print("|---|" + "---:|" * (2 * len(variants) + 1))
    for fmt in LAYOUT:
        spec = get_format(fmt)
        raw = random_blocks(fmt, n_out * n_in // spec.block_size, rng).reshape(n_out, -1)
        x = rng.normal(size=(1, n_in)).astype(np.float32)
        group, interleave = LAYOUT[fmt][2:]
        y = np.empty((1, n_out), np.float32)
        cells = []
        for act, dtype in (("i16", np.int16), ("i8", np.int8)):
            q, step = np.empty((1, n_in), dtype), np.empty((1, n_in // group), np.float32)
            sums = np.empty(step.shape, np.int32)
            quantize_codes(x, group, interleave, Q_MAX[act], q, step, sums)
            for isa in variants:
                fn = row_function(fmt, act, isa)
                call = lambda: fn(raw.ctypes.data, raw.shape[1], n_out, q.ctypes.data, step.shape[1], FP16.ctypes.data,
                                  step.ctypes.data, sums.ctypes.data, y.ctypes.data)
                call()
                cells.append(f"{raw.nbytes / _best(call, reps) / 1e9:.1f}")
        old = quantize_rows(x, group, interleave)
        args = (FORMATS[spec.ggml_type][0], raw[None], np.zeros(1, np.int64), np.array([0, 1]), np.zeros(1, np.int64),
                old.q, old.step, old.sums, FP16, y)
        gemv_rows(*args)
        cells.append(f"{raw.nbytes / _best(lambda: gemv_rows(*args), reps) / 1e9:.1f}")
        print(f"| {fmt} | " + " | ".join(cells) + " |", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Print the table; 0 if every SIMD path stays within its bound, else 1."""
    args = parser().parse_args(argv)
    if args.row_kernels:
        row_kernel_table(max(args.reps, 5))
        return 0
    if args.calls:
        from strata.bench.pool_calls import calls_table

        return calls_table(args, _stack, read_rate)
    only = {f.strip().upper() for f in args.formats.split(",") if f.strip()}
    threads = pool_threads(args.threads)
    worker_setup(threads, args.chunksize)  # the pool's settings, on this (the calling) thread
    print(f"CPU expert pool: {args.experts} missed experts x {args.tokens} token(s), {threads} numba threads "
          f"(chunk size {args.chunksize or 'static'}), SIMD "
          f"variant {ISA}; calls cycle over {args.footprint_mb} MB of weights")
    print("| shape | gate/up/down | experts x tokens | MB a call | read GB/s | int16 GB/s | of read | err/bound | "
          "int8 GB/s | of read | err/bound | old GB/s | of read | torch GB/s |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rng = np.random.default_rng(0)
    ok = True
    for label, embd, ff, formats in SHAPES:
        for types in formats:
            if only and types[0] not in only:
                continue
            line, passed = run_case(label, embd, ff, types, args, rng)
            ok &= passed
            print(line + ("" if passed else " FAIL"), flush=True)
    print(f"numba threading layer {numba.threading_layer()}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
