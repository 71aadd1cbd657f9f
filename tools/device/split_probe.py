"""On the GPU (issue 4): an A3B layer's four Q4_0 matvecs as a chain of launches in one CUDA graph, 48 layers of
distinct weights: GGUF rows through the engine's decode matvec (`quant_matvec`: the one-shot kernel) and its dp4a
matvec (STRATA_DP4A's), against split rows (`q4_0_split`: 16-byte code loads, dp4a) at several tiles. Every form's
output is checked against float64 first (each shape once), then timed with PDL as the engine launches it
(STRATA_PDL, default 1). (Session 15's calls 3-4 also timed a float kernel on split rows, since removed: d9cefb9.)

Shapes (A3B, Q4_0): q/k/v [5120, 2048], o [2048, 4096], the eight chosen experts' gate/up as one [12288, 2048]
matrix and their down as one [2048, 6144] (the same bytes as eight [2048, 768] summed).

Usage: python3 tools/device/split_probe.py [--layers 48] [--dp4a-tiles 8x4,16x4,32x4,32x8]
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from strata.bench.ceilings import graph_us, read_bandwidth  # noqa: E402
from strata.kernels.quant.matvec import ERROR_BOUND, quant_matvec  # noqa: E402
from strata.kernels.moe.dp4a_gemv import dp4a_matvec, quantize_x, row_error_bound  # noqa: E402
from strata.kernels.quant.q4_0_split import split_dp4a_matvec, split_rows  # noqa: E402
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
    ap.add_argument("--dp4a-tiles", default="8x4,16x4,32x4,32x8", help="BNxWARPS of the split dp4a kernel")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    parse = lambda text: [tuple(int(v) for v in t.split("x")) for t in text.split(",") if t]  # noqa: E731
    xs = {name: torch.randn(1, k, device="cuda", generator=gen).bfloat16() for name, (_, k) in SHAPES.items()}
    xqs = {name: quantize_x(x) for name, x in xs.items()}  # once, outside the timed chain
    outs32 = {name: torch.empty(1, n, dtype=torch.float32, device="cuda") for name, (n, _) in SHAPES.items()}
    # Each form: (label, short name, fn(name, gguf rows, split rows) -> y, dp4a?); dp4a forms: x's rounding bound.
    forms = [("gguf rows, the engine's matvec", "gguf", lambda n, g, s: quant_matvec(xs[n], g, Q4_0, SHAPES[n]),
              False),
             ("gguf rows, the engine's dp4a matvec", "gguf dp4a",
              lambda n, g, s: dp4a_matvec(xqs[n], g, SHAPES[n][0], y=outs32[n], pdl=True), True)]
    for bn, warps in parse(args.dp4a_tiles):
        forms.append((f"split rows, dp4a, {bn} rows x {warps} warps", f"split {bn}x{warps}",
                      lambda n, g, s, bn=bn, warps=warps:
                      split_dp4a_matvec(xqs[n], s, SHAPES[n][0], bn=bn, warps=warps, out=outs32[n]), True))
    for name, (n, k) in SHAPES.items():
        raw = random_q4_0(n, k, gen)
        w64 = dequantize(raw, Q4_0, (n, k)).double()
        want = xs[name].double() @ w64.T
        bound = row_error_bound(w64, xs[name].float(), xqs[name], terms=k // 32)
        float_bound = 2.0**-8 * want.abs() + ERROR_BOUND * want.abs().max()  # bf16's rounding of each output
        line = f"check {name:8s} [{n}, {k}]:"
        for _, short, fn, rounded in forms:
            got = fn(name, raw, split_rows(raw)).double()
            err = float((got - want).abs().max()) / float(want.abs().max())
            ok = bool(((got - want).abs() <= (bound if rounded else float_bound)).all())
            line += f" {short} {err:.2e} {'OK' if ok else 'FAIL'};"
        print(line + " (the float form: within bf16's rounding of each output plus matvec.ERROR_BOUND; dp4a: "
              "row_error_bound)", flush=True)
    stages = [(name, random_q4_0(*SHAPES[name], gen)) for _ in range(args.layers) for name in SHAPES]
    split = [split_rows(raw) for _, raw in stages]
    layer_bytes = sum(n * k // 32 * 18 for n, k in SHAPES.values())
    rate = read_bandwidth(torch.device("cuda"))
    print(f"copy rate {rate / 1e12:.2f} TB/s; a layer's weights {layer_bytes / 1e6:.1f} MB: "
          f"{layer_bytes / rate * 1e6:.2f} us at that rate (x quantized outside the chain for the dp4a forms)",
          flush=True)
    calls = [(i,) for i in range(len(stages))]
    for label, _, fn, _ in forms:
        def chain(i: int, fn=fn) -> None:
            fn(stages[i][0], stages[i][1], split[i])
        us = graph_us(chain, calls, "cuda") * len(SHAPES)
        line = (f"  {label:40s} {us:7.2f} us a layer  {layer_bytes / us / 1e3:6.0f} GB/s  "
                f"{layer_bytes / rate * 1e6 / us:6.1%} of the copy rate;")
        for name in SHAPES:  # each shape alone, its 48 layers in a row
            only = [(i,) for i in range(len(stages)) if stages[i][0] == name]
            line += f" {name} {graph_us(chain, only, 'cuda'):5.2f}"
        print(line, flush=True)
    print("  (bytes at the copy rate: " + ", ".join(f"{name} {n * k // 32 * 18 / rate * 1e6:.2f} us"
                                                    for name, (n, k) in SHAPES.items()) + ")")


if __name__ == "__main__":
    main()
