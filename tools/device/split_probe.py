"""On the GPU (issue 4): an A3B layer's four Q4_0 matvecs as a chain of launches in one CUDA graph, 48 layers of
distinct weights, GGUF rows through the engine's decode matvec (`quant_matvec`: the one-shot kernel) against split
rows (`q4_0_split.split_matvec`: 16-byte code loads) at several tiles. Every form's output is checked against
float64 first (each shape once), then timed with PDL as the engine launches it (STRATA_PDL, default 1).

Shapes (A3B, Q4_0): q/k/v [5120, 2048], o [2048, 4096], the eight chosen experts' gate/up as one [12288, 2048]
matrix and their down as one [2048, 6144] (the same bytes as eight [2048, 768] summed).

Usage: python3 tools/device/split_probe.py [--layers 48] [--tiles 8x4,16x4,16x8,32x8]
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from strata.bench.ceilings import graph_us, read_bandwidth  # noqa: E402
from strata.kernels.quant.matvec import ERROR_BOUND, quant_matvec  # noqa: E402
from strata.kernels.quant.q4_0_split import _split_matvec_kernel, split_matvec, split_rows  # noqa: E402
from strata.quant import dequantize, get_format  # noqa: E402

Q4_0 = get_format("Q4_0").ggml_type
SHAPES = {"qkv": (5120, 2048), "o": (2048, 4096), "gate_up": (12288, 2048), "down": (2048, 6144)}


def random_q4_0(n_out: int, n_in: int, gen: torch.Generator) -> torch.Tensor:
    """uint8 [n_out, row bytes] of Q4_0 blocks: random codes, scales in [1e-3, 1.1e-2)."""
    raw = torch.randint(0, 256, (n_out, n_in // 32, 18), dtype=torch.uint8, device="cuda", generator=gen)
    scales = (torch.rand(n_out, n_in // 32, device="cuda", generator=gen) * 0.01 + 0.001).half()
    raw[:, :, :2] = scales.view(torch.uint8).view(n_out, n_in // 32, 2)
    return raw.reshape(n_out, -1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--tiles", default="8x4,16x4,16x8,32x8", help="BNxWARPS of the split kernel")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    tiles = [tuple(int(v) for v in t.split("x")) for t in args.tiles.split(",")]
    xs = {name: torch.randn(1, k, device="cuda", generator=gen).bfloat16() for name, (_, k) in SHAPES.items()}
    for name, (n, k) in SHAPES.items():
        raw = random_q4_0(n, k, gen)
        want = xs[name].double() @ dequantize(raw, Q4_0, (n, k)).double().T
        top = float(want.abs().max())
        line = f"check {name:8s} [{n}, {k}]: gguf {float((quant_matvec(xs[name], raw, Q4_0, (n, k)).double() - want).abs().max()) / top:.2e}"
        for bn, warps in tiles:
            got = split_matvec(xs[name], split_rows(raw), n, bn=bn, warps=warps).double()
            built = _split_matvec_kernel[(1,)](xs[name], split_rows(raw), torch.empty_like(got).bfloat16(), n, K=k,
                                               NBP=1 << (k // 32 - 1).bit_length(), BN=bn, ROWS=1, num_warps=warps)
            line += (f", split {bn}x{warps} {float((got - want).abs().max()) / top:.2e}"
                     f" ({built.n_regs} regs, {built.n_spills} spills)")
        print(line + f" of max |y| (bound {ERROR_BOUND:.0e}; bf16 outputs round at 4e-3)", flush=True)
    stages = [(name, random_q4_0(*SHAPES[name], gen)) for _ in range(args.layers) for name in SHAPES]
    split = [split_rows(raw) for _, raw in stages]
    outs = {name: torch.empty(1, n, dtype=torch.bfloat16, device="cuda") for name, (n, _) in SHAPES.items()}
    layer_bytes = sum(n * k // 32 * 18 for n, k in SHAPES.values())
    rate = read_bandwidth(torch.device("cuda"))
    print(f"copy rate {rate / 1e12:.2f} TB/s; a layer's weights {layer_bytes / 1e6:.1f} MB: "
          f"{layer_bytes / rate * 1e6:.2f} us at that rate", flush=True)

    def report(label: str, us_per_call: float) -> None:
        us = us_per_call * len(SHAPES)
        print(f"  {label:34s} {us:7.2f} us a layer  {layer_bytes / us / 1e3:6.0f} GB/s  "
              f"{layer_bytes / rate * 1e6 / us:6.1%} of the copy rate", flush=True)

    def gguf(i: int) -> None:
        name, raw = stages[i]
        quant_matvec(xs[name], raw, Q4_0, SHAPES[name])

    calls = [(i,) for i in range(len(stages))]
    report("gguf rows, the engine's matvec", graph_us(gguf, calls, "cuda"))
    for bn, warps in tiles:
        def split_form(i: int, bn=bn, warps=warps) -> None:
            name = stages[i][0]
            split_matvec(xs[name], split[i], SHAPES[name][0], bn=bn, warps=warps, out=outs[name])
        report(f"split rows, {bn} rows x {warps} warps", graph_us(split_form, calls, "cuda"))
    for name, (n, k) in SHAPES.items():  # each shape alone (its 48 layers in a row)
        line = f"  {name:8s}"
        only = [(i,) for i in range(len(stages)) if stages[i][0] == name]
        line += f" gguf {graph_us(gguf, only, 'cuda'):6.2f} us"
        for bn, warps in tiles:
            def split_form(i: int, bn=bn, warps=warps) -> None:
                split_matvec(xs[name], split[i], n, bn=bn, warps=warps, out=outs[name])
            line += f", split {bn}x{warps} {graph_us(split_form, only, 'cuda'):6.2f} us"
        print(line + f"  (bytes at the copy rate {n * k // 32 * 18 / rate * 1e6:.2f} us)", flush=True)


if __name__ == "__main__":
    main()
