"""GB/s of the CPU expert pool on one layer's worth of missed experts (`strata bench cpu-experts`).

For each shape and format: the block kernels (`strata.engine.cpu_kernels`) and the old torch path (dequantize each
expert, multiply in float32) compute the same experts for one token each; the table gives expert weight bytes per
second beside the host's memory bandwidth measured in the same run (a large copy's bytes per second), and the
kernels' largest error against float64 as a share of their stated bound and of the outputs' largest magnitude.

    python -m strata.bench.cpu_experts [--experts 40] [--tokens 1] [--formats Q2_0,Q4_K] [--reps 5]
"""

from __future__ import annotations

import argparse
import sys
import time

import numba
import numpy as np
import torch

from strata.bench.ceilings import copy_bandwidth
from strata.engine.cpu_kernels import ACCUMULATION_ERROR, HostExperts, input_error, moe_experts, supported
from strata.engine.cpu_kernels.blocks import FORMATS
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
    p.add_argument("--reps", type=int, default=5, help="timed calls; the best is reported (default 5)")
    p.add_argument("--torch-reps", type=int, default=2, help="timed calls of the torch path (default 2)")
    return p


def _stack(types, n_experts, embd, ff, rng) -> ExpertStack:
    def matrix(qtype, rows, cols):
        fmt = get_format(qtype)
        raw = random_blocks(qtype, n_experts * rows * cols // fmt.block_size, rng).reshape(n_experts, rows, -1)
        return QuantWeight(qtype, fmt.ggml_type, (n_experts, rows, cols), torch.from_numpy(raw))

    return ExpertStack(matrix(types[0], ff, embd), matrix(types[1], ff, embd), matrix(types[2], embd, ff))


def _best(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _error_vs_float64(stack: ExpertStack, types, x: torch.Tensor, routes, weights, experts, out) -> tuple[float, float]:
    """(largest error / bound, largest error / largest |output|) of the kernels' output against float64, for the
    first few experts only (the bound's float64 products are slow at full size)."""
    def err_input(v, qtype):
        t = get_format(qtype).ggml_type
        return input_error(v, FORMATS[t][1]) if supported(t) else np.zeros_like(v)

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
    err = np.abs(out.double().numpy() - ref)
    return float((err / bound).max()), float(err.max() / np.abs(ref).max())


def run_case(label, embd, ff, types, args, rng) -> tuple[str, bool]:
    n_experts = args.experts + 8  # a few the layer does not miss, so the missed ones are not the whole stack
    stack = _stack(types, n_experts, embd, ff, rng)
    host = HostExperts(stack.gate, stack.up, stack.down)
    t = args.tokens
    x = torch.randn(t, embd, generator=torch.Generator().manual_seed(0))
    experts = list(range(4, 4 + args.experts))
    routes = {e: (torch.arange(t), torch.zeros(t, dtype=torch.long)) for e in experts}
    weights = torch.full((t, 1), 1.0 / args.experts)
    out = moe_experts(host, x, routes, weights, experts)  # compiles (or loads numba's cache) and warms up
    kernel_s = _best(lambda: moe_experts(host, x, routes, weights, experts), args.reps)
    ref = torch.zeros_like(x)

    def torch_path():
        ref.zero_()
        accumulate(ref, routes, weights, x, stack.expert, experts)

    torch_path()
    torch_s = _best(torch_path, args.torch_reps)
    check = experts[:4]
    part = moe_experts(host, x, routes, weights, check)
    ratio, rel = _error_vs_float64(stack, types, x, routes, weights, check, part)
    n_bytes = args.experts * stack.expert_bytes
    fmt = "/".join(types)
    line = (f"| {label} | {fmt} | {n_bytes / 1e6:.1f} | {kernel_s * 1e3:.2f} | {n_bytes / kernel_s / 1e9:.2f} | "
            f"{n_bytes / torch_s / 1e9:.3f} | {torch_s / kernel_s:.0f}x | {ratio:.3f} | {rel:.1e} |")
    return line, ratio <= 1


def main(argv: list[str] | None = None) -> int:
    """Print the table; 0 if every case stays within its bound, else 1."""
    args = parser().parse_args(argv)
    only = {f.strip().upper() for f in args.formats.split(",") if f.strip()}
    bandwidth = copy_bandwidth(torch.device("cpu")) / 2 / 1e9
    print(f"CPU expert pool: {args.experts} missed experts x {args.tokens} token(s), {numba.get_num_threads()} numba "
          f"threads, torch {torch.__version__} with {torch.get_num_threads()} threads")
    print(f"host memory bandwidth (copy, bytes/s read): {bandwidth:.2f} GB/s")
    print("| shape | gate/up/down | MB | kernels ms | kernels GB/s | torch GB/s | speed-up | err/bound | err/max|y| |")
    print("|---|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    ok = True
    for label, embd, ff, formats in SHAPES:
        for types in formats:
            if only and types[0] not in only:
                continue
            line, passed = run_case(label, embd, ff, types, args, rng)
            ok &= passed
            print(line + ("" if passed else " FAIL"), flush=True)
    print(f"numba threading layer {numba.threading_layer()}; memory bandwidth of the same run {bandwidth:.2f} GB/s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
