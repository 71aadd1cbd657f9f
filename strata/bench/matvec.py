"""Speed and parity of the dense quantized matvec of decode steps (`strata.kernels.quant.matvec`).

For each shape (n_in -> n_out: 2048x4096, 4096x2048 and the head 2048x151936; A3B's stacked q/k/v is 2048x5120,
qwen4exp's Q2_0 GDN projections 2560x10240, 2560x6144, 6144x2560) and format (Q4_0, Q8_0, Q4_K), `--rows` bf16 rows
(1; up to 4: a verify window, whose weight the one-shot kernel reads once) times the weight: microseconds per call
replayed from a CUDA graph (enough distinct weights per replay that they come from HBM rather than L2), the
weight's bytes over the HBM floor of the same run (`read_bandwidth`), GB/s, and the error against float64 (bf16 x,
float32 out); once with the word kernel (`kernels/moe/wide_gemv.py`, the default for these formats) and once with
the byte kernel it replaces (gemv.py's `byte_config`).

    python -m strata.bench.matvec [--shapes 2048x4096,4096x2048,2048x151936] [--formats Q4_0,Q8_0,Q4_K]
                                  [--rows 1] [--sweep [all|words|stream|oneshot]]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

import strata.kernels  # noqa: F401  (the interpreter switch, before Triton is imported)
from strata.bench.ceilings import copy_bandwidth, graph_us
from strata.bench.gemv_sweep import FAMILIES, sweep_configs, time_config
from strata.kernels.moe.decode import SPECS
from strata.kernels.moe.gemv import ERROR_BOUND, ExpertOperand, byte_config, gemv_config, launch_down, relative_error
from strata.kernels.quant.matvec import one_expert
from strata.quant import dequantize, get_format, random_blocks

L2_SPAN = 256 << 20  # bytes of distinct weights per graph replay: several times H200's 50 MB L2


def bench_one(n_in: int, n_out: int, fmt: str, device, floor_bw: float, out, sweep: str | None = None,
              n_rows: int = 1) -> bool:
    """One shape and format: both kernels, timed and checked (a float32 output, so the error is the kernel's own);
    `sweep` (a gemv_sweep family): then every config of `gemv_sweep.sweep_configs`, each checked as well."""
    info = get_format(fmt)
    rng = np.random.default_rng(n_in + n_out)
    n_bytes = info.row_bytes(n_in) * n_out
    on_gpu = torch.device(device).type == "cuda"
    copies = max(1, min(16, L2_SPAN // n_bytes)) if on_gpu else 1
    weights = [ExpertOperand(torch.from_numpy(random_blocks(fmt, n_out * n_in // info.block_size, rng, 0.02))
                             .to(device), info.ggml_type, n_out, n_in, stride=0) for _ in range(copies)]
    rows = torch.randn(n_rows, 1, n_in, generator=torch.Generator().manual_seed(1)).to(device, torch.bfloat16)
    ids, ones = one_expert(torch.device(device), n_rows)
    w64 = dequantize(weights[0].raw.reshape(n_out, -1), info.ggml_type, (n_out, n_in)).double()  # on the device
    want = rows.reshape(n_rows, n_in).double() @ w64.T
    del w64
    ok = True
    for cfg in (byte_config("matvec", SPECS[fmt], n_out, n_in, 1, on_gpu),
                gemv_config("matvec", SPECS[fmt], n_out, n_in, 1, on_gpu)):
        def call(i, c=cfg):
            return launch_down(rows, ids, ones, weights[i % copies], None, torch.float32, c)

        err = relative_error(call(0), want)
        ok &= err <= ERROR_BOUND
        us = graph_us(call, [(i,) for i in range(4 * copies)], device)
        floor_us = n_bytes / floor_bw * 1e6
        loads = ("oneshot" if cfg.oneshot else "words") if cfg.wide else "bytes"
        print(f"{n_in}x{n_out:<7} {fmt:<5} {loads:<5} {n_bytes / 1e6:8.2f} {floor_us:8.2f} "
              f"{us:8.2f} {floor_us / us:6.1%} {n_bytes / us / 1e3:7.0f} {err:9.2e}  bn={cfg.bn} ns={cfg.ns} "
              f"warps={cfg.warps} split={cfg.split}{'' if err <= ERROR_BOUND else '  FAIL'}", file=out, flush=True)
    if sweep:
        default_us, outputs = None, {}
        family = sweep if sweep in FAMILIES else "all"
        for cfg in sweep_configs("matvec", SPECS[fmt], n_out, n_in, 1, family=family):
            def call(i, c=cfg):
                return launch_down(rows, ids, ones, weights[i % copies], None, torch.float32, c)

            label = f"{n_in}x{n_out} {fmt}" + (f" x{n_rows}" if n_rows > 1 else "")
            good, default_us = time_config(label, cfg, call, [(i,) for i in range(4 * copies)], want, n_bytes,
                                           floor_bw, default_us, device, out, outputs)
            ok &= good
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="strata bench matvec", description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="2048x4096,4096x2048,2048x151936", help="comma-separated n_in x n_out")
    p.add_argument("--formats", default="Q4_0,Q8_0,Q4_K", help="comma-separated, of: " + ", ".join(SPECS))
    p.add_argument("--rows", type=int, default=1, help="rows of x (1..4: a verify window), the weight read once")
    p.add_argument("--sweep", nargs="?", const="all", choices=FAMILIES,
                   help="time launch configurations beside the default (bench/gemv_sweep.py), each checked")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("matvec: needs a CUDA GPU (the kernel's CPU tests are tests/kernels/quant/test_matvec.py)")
        return 2
    device = torch.device("cuda")
    out = sys.stdout
    bw = copy_bandwidth(device)
    floor_bw = bw  # ceilings.read_bandwidth: a read-only stream runs at the copy's whole traffic rate
    print(f"{torch.cuda.get_device_name(device)}; copy {bw / 1e12:.2f} TB/s (read + write); floor = weight bytes / "
          f"{floor_bw / 1e12:.2f} TB/s; error = max|y - float64| / max|float64| of float32 x (bound {ERROR_BOUND:g})",
          file=out)
    print(f"{'shape':<12} {'fmt':<5} {'loads':<5} {'MB':>8} {'floor us':>8} {'us/call':>8} {'floor%':>6} "
          f"{'GB/s':>7} {'err':>9}", file=out)
    ok = True
    for shape in args.shapes.split(","):
        n_in, n_out = (int(v) for v in shape.lower().split("x"))
        for fmt in args.formats.split(","):
            ok &= bench_one(n_in, n_out, fmt.strip(), device, floor_bw, out, args.sweep, args.rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
