"""Parity and speed of the three prompt expert paths on one synthetic MoE layer (`strata bench moe-prefill`).

The layer follows Strata's fused-kernel tests: N = 2560, FF = 640, 512 experts, top 10; skewed routing (experts 0
and 1 in every token, the rest Zipf-like, the last four never chosen); x ~ N(0, 1) with one value in 200 times 12;
one token all zeros. Each path is compared with float64 on the dequantized weights, with and without the path's own
rounding of x and H, and with the other paths; its time is printed beside the floor of the same run: routed
multiply-adds over the measured int8 matrix rate (torch._int_mm, the faster B layout), or the fp16 rate for the dense
path.

    python -m strata.bench.moe_prefill [--only "Q2_0 / Q2_0"] [--tokens 2048,8192,16384]

With --sweep [[BMx]BNxWARPSxSTAGES,...] it times each path under each launch shape instead (every kernel of the path
takes the shape), beside the default shapes, and checks that every shape gives the default's bytes (the fused fp16
shapes, which round differently: the bounds above).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch

from strata.bench.ceilings import sync
from strata.kernels.moe import fused, grouping, quantize32
from strata.kernels.moe.prefill import PATHS, PromptExperts, moe_prefill
from strata.kernels.moe.reference import moe_float64
from strata.kernels.moe.stack import ExpertMatrix, Tiles
from strata.quant import get_format, random_blocks

PAIRS = ["Q2_0 / Q2_0", "IQ2_XS / Q2_0", "IQ3_XXS / Q2_0", "IQ3_S / Q2_0", "IQ4_XS / IQ4_NL", "Q4_K / Q2_0"]
# [BMx]BNxWARPSxSTAGES; shapes whose sm_90 build spills in the int8 matmul (128x128, 256 at 8 warps) left out.
SWEEP = ["64x8x2", "64x8x3", "64x4x2", "32x8x3", "128x8x1", "128x8x2", "128x8x3", "128x16x2", "128x32x8x2",
         "128x64x8x2", "128x64x8x3"]
# The fused path's: gate/up features per program (twice as many weight rows) x warps x stages / the down
# projection's outputs x warps x stages; BM (64 or 128 rows) shared. Letters (`Tiles`): "s" two 32-value dots a step
# instead of one block-diagonal 64; "m" int32 dots made floats by an MMA started from a float's bits; "h" fp16 MMAs
# on exactly decoded weights, no per-step epilogue (within the bounds, not the default's bytes); "w" (with "h") two
# blocks a step. Spilling builds (sm_90) left out.
FUSED_SWEEP = ["128x64x8x3h/128x128x8x3h", "32x4x3h/64x4x3h", "64x8x3h/128x8x3h", "128x16x3h/256x16x3h",
               "32x4x3hw/64x4x3hw", "128x32x4x3h/128x64x4x3h", "128x8x3h/256x8x3h", "128x64x8x3hw/128x128x8x3hw",
               "32x4x2s/64x4x2h", "32x4x2sm/64x4x2sm"]  # the likeliest first: a run cut by its cap keeps them
ROUNDING = {"dense": "fp16", "mmq": "int8", "fused": "int8"}  # what each path does to x and H

# Strata's bounds (prefill_fused_*_test), applied to every pair.
FUSED_RMS_VS_MMQ, FUSED_WORST_VS_MMQ = 1.5, 2.0  # vs the float64 definition, as multiples of the mmq path's error
ROUNDED_RMS, ROUNDED_WORST = 2e-3, 3e-2  # the int8 paths vs float64 with the same int8 rounding of x and H
DENSE_RMS, DENSE_WORST = 1e-3, 1e-2  # the fp16 path vs float64 with the same fp16 rounding


@dataclass
class Layer:
    x: torch.Tensor  # float32 [T, N]
    topk_ids: torch.Tensor  # int32 [T, k]
    topk_weights: torch.Tensor  # float32 [T, k]
    experts: PromptExperts
    zero_token: int


def _matrix(qtype: str, n_experts: int, rows: int, cols: int, rng: np.random.Generator, device) -> ExpertMatrix:
    fmt = get_format(qtype)
    raw = random_blocks(qtype, n_experts * rows * cols // fmt.block_size, rng, 0.02)
    return ExpertMatrix(torch.from_numpy(raw).reshape(n_experts, rows, -1).to(device), fmt.ggml_type, rows, cols)


def skewed_routing(n_tokens: int, n_experts: int, top_k: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Experts 0 and 1 in every token, the others drawn with probability ~ 1/rank^0.8, the last four never."""
    if n_experts < top_k + 6:
        raise ValueError(f"skewed routing needs at least top_k + 6 = {top_k + 6} experts")
    p = torch.zeros(n_experts)
    p[2 : n_experts - 4] = torch.arange(1, n_experts - 5, dtype=torch.float32) ** -0.8
    rest = torch.multinomial(p.expand(n_tokens, -1), top_k - 2, replacement=False, generator=gen)
    ids = torch.cat([torch.tensor([[0, 1]]).expand(n_tokens, 2), rest], dim=1).int()
    weights = torch.softmax(torch.randn(n_tokens, top_k, generator=gen), dim=-1)
    return ids, weights


@functools.lru_cache(maxsize=1)  # the chunk sizes of one pair share its experts (full size: 700 MB of blocks)
def make_experts(pair: str, n_experts: int, n_embd: int, n_ff: int, seed: int, device: str) -> PromptExperts:
    """Random valid blocks for the format pair "GATE_UP / DOWN": weights of standard deviation 0.02."""
    gate_up, down = (name.strip() for name in pair.split("/"))
    rng = np.random.default_rng(seed)
    return PromptExperts(_matrix(gate_up, n_experts, n_ff, n_embd, rng, device),
                         _matrix(gate_up, n_experts, n_ff, n_embd, rng, device),
                         _matrix(down, n_experts, n_embd, n_ff, rng, device))


def make_layer(pair: str, n_tokens: int, n_experts: int = 512, n_embd: int = 2560, n_ff: int = 640, top_k: int = 10,
               seed: int = 0, device: str | torch.device = "cpu") -> Layer:
    """A synthetic layer of the format pair "GATE_UP / DOWN" with its routed chunk of n_tokens."""
    experts = make_experts(pair, n_experts, n_embd, n_ff, seed, str(device))
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n_tokens, n_embd, generator=gen)
    x[torch.rand(n_tokens, n_embd, generator=gen) < 1 / 200] *= 12
    zero_token = 77 if n_tokens > 77 else n_tokens // 2
    x[zero_token] = 0
    ids, weights = skewed_routing(n_tokens, n_experts, top_k, gen)
    return Layer(x.to(device), ids.to(device), weights.to(device), experts, zero_token)


def errors(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(rel RMS, worst row): sqrt(sum err^2 / sum ref^2) and max over rows of max|err| / max|ref|."""
    err = out.double() - ref.double()
    rms = (err.square().sum() / ref.double().square().sum().clamp_min(1e-300)).sqrt().item()
    worst = (err.abs().amax(dim=1).max() / ref.double().abs().max().clamp_min(1e-300)).item()
    return rms, worst


def timed(fn, device: torch.device, reps: int) -> tuple[float, torch.Tensor]:
    """Median milliseconds of reps calls after one warm-up, and the last output."""
    out = fn()
    times = []
    for _ in range(reps):
        sync(device)
        start = time.perf_counter()
        out = fn()
        sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), out


def int8_rate(device: torch.device, m: int = 16384, k: int = 2560, n: int = 2560) -> float:
    """Measured int8 ops/s of torch._int_mm on an [m, k] x [k, n] product: the faster of B row-major and B
    column-major. cuBLASLt's int8 tensor-core kernels want the second ("TN"), and session 6's H200 runs measured
    112 TOPS with the first only, far under the int8 tensor cores."""
    if device.type != "cuda":  # a CPU run checks the tool, not the machine
        m, k, n = 256, 512, 512
    a8 = torch.randint(-127, 128, (m, k), dtype=torch.int8, device=device)
    b8 = torch.randint(-127, 128, (k, n), dtype=torch.int8, device=device)
    b8_columns = b8.t().contiguous().t()  # the same values, column-major
    int8_ms, _ = timed(lambda: torch._int_mm(a8, b8), device, 10)
    try:
        int8_ms = min(int8_ms, timed(lambda: torch._int_mm(a8, b8_columns), device, 10)[0])
    except RuntimeError:  # a build without that layout: the row-major rate stands
        pass
    return 2.0 * m * k * n / (int8_ms * 1e-3)


def matrix_rates(device: torch.device, m: int = 16384, k: int = 2560, n: int = 2560) -> tuple[float, float]:
    """Measured (int8 ops/s of torch._int_mm, `int8_rate`; fp16 flop/s of a matmul) on an [m, k] x [k, n]
    product."""
    int8 = int8_rate(device, m, k, n)
    if device.type != "cuda":
        m, k, n = 256, 512, 512
    a16 = torch.randint(-127, 128, (m, k), device=device).half()
    b16 = torch.randint(-127, 128, (k, n), device=device).half()
    fp16_ms, _ = timed(lambda: a16 @ b16 if device.type == "cuda" else a16.float() @ b16.float(), device, 10)
    return int8, 2.0 * m * k * n / (fp16_ms * 1e-3)


def best_int8_rate(device: torch.device, at_layer: float) -> float:
    """The larger of the layer-shape int8 rate and torch._int_mm's at 8192^3, where cuBLAS runs nearest its peak
    (session 8's H200: ~960-1,000 TOPS there against 560-710 at 16384 x 2560 x 2560): the stricter floor."""
    side = 8192 if device.type == "cuda" else 256
    return max(at_layer, int8_rate(device, side, side, side))


def bench_pair(pair: str, n_tokens: int, args, rates: tuple[float, float, float], device: torch.device) -> bool:
    """rates: int8 at the layer's shape, fp16, the best int8 (ops/s); "x best" is the time over the last's floor."""
    layer = make_layer(pair, n_tokens, args.experts, args.embd, args.ff, args.top_k, args.seed, device)
    refs = moe_float64(layer.x, layer.topk_ids, layer.topk_weights, layer.experts, roundings=(None, "int8", "fp16"))
    mads = n_tokens * args.top_k * 3 * args.embd * args.ff  # gate, up and down multiply-adds of the routed rows
    floor_int8, floor_fp16 = 2 * mads / rates[0] * 1e3, 2 * mads / rates[1] * 1e3
    floor_best = 2 * mads / rates[2] * 1e3
    print(f"\n{pair}, {n_tokens} tokens: {n_tokens * args.top_k} routed rows, {mads / 1e9:.1f} G multiply-adds; "
          f"floor {floor_int8:.3f} ms int8, {floor_fp16:.3f} ms fp16, {floor_best:.3f} ms at the best int8 rate")
    print(f"  {'path':6} {'ms':>9} {'x floor':>8} {'x best':>7}   {'vs FP64 rms':>11} {'worst':>8}   "
          f"{'vs rounded rms':>14} {'worst':>8}   zero token")
    outs, stats, ok = {}, {}, True
    for path in args.paths:
        ms, out = timed(lambda: moe_prefill(layer.x, layer.topk_ids, layer.topk_weights, layer.experts, path),
                        device, args.reps)
        outs[path] = out
        exact, rounded = errors(out, refs[None]), errors(out, refs[ROUNDING[path]])
        zero = out[layer.zero_token].abs().max().item()
        stats[path] = exact
        floor = floor_fp16 if path == "dense" else floor_int8
        best = ms / (floor_fp16 if path == "dense" else floor_best)
        print(f"  {path:6} {ms:9.3f} {ms / floor:8.1f} {best:7.1f}   {exact[0]:11.3e} {exact[1]:8.2e}   "
              f"{rounded[0]:14.3e} {rounded[1]:8.2e}   {zero:g}")
        ok &= check(f"{path} zero token exactly 0", zero == 0.0)
        rms_bound, worst_bound = (DENSE_RMS, DENSE_WORST) if path == "dense" else (ROUNDED_RMS, ROUNDED_WORST)
        ok &= check(f"{path} vs float64 with its rounding: rms {rounded[0]:.2e} <= {rms_bound:g}, "
                    f"worst {rounded[1]:.2e} <= {worst_bound:g}", rounded[0] <= rms_bound and rounded[1] <= worst_bound)
    for a, b in [(p, q) for i, p in enumerate(args.paths) for q in args.paths[i + 1:]]:
        rms, worst = errors(outs[b], outs[a])
        print(f"  {b} vs {a}: rel RMS {rms:.3e}, worst row max rel {worst:.3e}")
    if "mmq" in stats and "fused" in stats:
        (m_rms, m_worst), (f_rms, f_worst) = stats["mmq"], stats["fused"]
        ok &= check(f"fused vs FP64 rms {f_rms:.3e} <= {FUSED_RMS_VS_MMQ} x mmq's {m_rms:.3e}, worst {f_worst:.3e} "
                    f"<= {FUSED_WORST_VS_MMQ} x mmq's {m_worst:.3e}",
                    f_rms <= FUSED_RMS_VS_MMQ * m_rms and f_worst <= FUSED_WORST_VS_MMQ * m_worst)
    return ok


def sweep_pair(pair: str, n_tokens: int, args, device: torch.device) -> bool:
    """ms of each path under each launch shape of args.sweep, beside its default shapes; False if a shape's output
    differs from the default's (the shapes change the order of nothing, so the bytes must match), or, for the shapes
    that round differently (`Tiles.same_bytes`: the fused fp16 variant), if it misses the bounds `bench_pair`
    checks (vs float64 with the int8 rounding; vs float64 within 1.5x / 2x of the default's error; zero token 0)."""
    layer = make_layer(pair, n_tokens, args.experts, args.embd, args.ff, args.top_k, args.seed, device)
    print(f"\n{pair}, {n_tokens} tokens: ms per launch shape (BN x warps x stages)")
    refs = functools.cache(lambda: moe_float64(layer.x, layer.topk_ids, layer.topk_weights, layer.experts,
                                               roundings=(None, "int8")))
    ok = True
    for path in args.paths:
        shapes = args.sweep if args.sweep != "default" else [Tiles.parse(t) for t in
                                                              (FUSED_SWEEP if path == "fused" else SWEEP)]

        def run(tiles):
            return moe_prefill(layer.x, layer.topk_ids, layer.topk_weights, layer.experts, path, tiles=tiles)

        base_ms, base = timed(lambda: run(None), device, args.reps)
        # One line a shape as it is timed (flushed): a run cut by its time cap keeps the shapes it reached.
        print(f"  {path:6} default {base_ms:.3f}{_parts(layer, None, device, args.reps, path)}", flush=True)
        for tiles in shapes:
            try:
                ms, out = timed(lambda: run(tiles), device, args.reps)
            except Exception as e:  # a shape that does not build (shared memory, registers) is a result, not an end
                print(f"  {path:6} {tiles} failed ({type(e).__name__})", flush=True)
                continue
            cell = f"  {path:6} {tiles} {ms:.3f} ({base_ms / ms:.2f}x){_parts(layer, tiles, device, args.reps, path)}"
            if tiles.same_bytes or path != "fused":
                same = torch.equal(out, base)
                ok &= same
                print(cell + ("" if same else " DIFFERENT BYTES"), flush=True)
                continue
            within, note = _within_bounds(out, base, refs(), layer.zero_token)
            ok &= within
            print(f"{cell}{'' if within else ' OUT OF BOUNDS'}\n    {note}", flush=True)
    return ok


def _parts(layer: Layer, tiles: Tiles | None, device: torch.device, reps: int, path: str) -> str:
    """The fused Q2_0 path's two kernels timed alone, " [gate-up G + down D]" ms (the rest of the path: x's
    rounding, the grouping and the combine), or "" for the other paths and formats."""
    e = layer.experts
    if path != "fused" or not (e.gate.spec.scale_per_64 and e.down.spec.scale_per_64):
        return ""
    group = grouping.group_pairs(layer.topk_ids, e.n_experts, tiles.rows if tiles else grouping.TILE_ROWS)
    xq = quantize32.quantize_rows(layer.x)
    h16 = fused.fp16_h(e.down, tiles, layer.x.is_cuda)
    gate_up_ms, h = timed(lambda: fused.gate_up_swiglu_int8(*xq, group, e.gate, e.up, tiles, None, None, h16),
                          device, reps)
    down_ms, _ = timed(lambda: fused.down_int8(*h, group, e.down, tiles), device, reps)
    return f" [gate-up {gate_up_ms:.3f} + down {down_ms:.3f}]"


def _within_bounds(out, base, refs, zero_token: int) -> tuple[bool, str]:
    """A shape that rounds differently against the bounds of `bench_pair`, its default's error standing for mmq's."""
    (rms, worst), (x_rms, x_worst), (b_rms, b_worst) = (errors(out, refs["int8"]), errors(out, refs[None]),
                                                        errors(base, refs[None]))
    zero = out[zero_token].abs().max().item()
    ok = (rms <= ROUNDED_RMS and worst <= ROUNDED_WORST and x_rms <= FUSED_RMS_VS_MMQ * b_rms
          and x_worst <= FUSED_WORST_VS_MMQ * b_worst and zero == 0.0)
    return ok, (f"vs rounded rms {rms:.2e} worst {worst:.2e}; vs FP64 rms {x_rms:.3e} worst {x_worst:.2e} "
                f"(default {b_rms:.3e} / {b_worst:.2e}); zero token {zero:g}")


def check(what: str, passed: bool) -> bool:
    print(f"  {'PASS' if passed else 'FAIL'} {what}")
    return passed


def parse_args(argv):
    p = argparse.ArgumentParser(prog="strata bench moe-prefill", description=__doc__.split("\n\n")[0])
    p.add_argument("--only", help=f'format pairs "GATE_UP / DOWN", comma-separated (default: {", ".join(PAIRS)})')
    p.add_argument("--tokens", default="2048", help="comma-separated chunk sizes (default 2048)")
    p.add_argument("--paths", default=",".join(PATHS), help="comma-separated paths (default dense,mmq,fused)")
    p.add_argument("--experts", type=int, default=512)
    p.add_argument("--embd", type=int, default=2560)
    p.add_argument("--ff", type=int, default=640)
    p.add_argument("--top-k", type=int, default=10)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--sweep", nargs="?", const="default", metavar="SHAPES",
                   help="time launch shapes [BMx]BNxWARPSxSTAGES[/BNxWARPSxSTAGES for the fused down] instead of "
                        "checking bounds; fused Q2_0 letters after a shape: s (two 32-value dots), m (int32 dots to "
                        "float by MMA from a float's bits), h (fp16 MMAs, checked against the bounds), w (with h: "
                        "two blocks a step), r (a tile half padding computed as a half tile), o (on the down "
                        "shape: its rows stored as fp16 for the combine) "
                        f"(default lists: {','.join(SWEEP)}; fused: {','.join(FUSED_SWEEP)})")
    args = p.parse_args(argv)
    if args.sweep and args.sweep != "default":
        args.sweep = [Tiles.parse(t.strip()) for t in args.sweep.split(",")]
    args.pairs = [pair.strip() for pair in args.only.split(",")] if args.only else PAIRS
    args.tokens = [int(t) for t in str(args.tokens).split(",")]
    args.paths = [q.strip() for q in args.paths.split(",")]
    return args


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (torch references, not kernels)"
    import triton

    print(f"moe-prefill on {name}; torch {torch.__version__}, triton {triton.__version__}; N={args.embd} "
          f"FF={args.ff} E={args.experts} top {args.top_k}; median of {args.reps}")
    if args.sweep:
        ok = all([sweep_pair(pair, n_tokens, args, device) for pair in args.pairs for n_tokens in args.tokens])
        print("\nPASS: every shape gives the default bytes (fp16 shapes: within the bounds)" if ok else
              "\nFAIL: some shapes change the bytes or miss the bounds")
        return 0 if ok else 1
    rates = matrix_rates(device)
    rates = (*rates, best_int8_rate(device, rates[0]))
    print(f"measured matrix rates: int8 {rates[0] / 1e12:.1f} TOPS (torch._int_mm), fp16 {rates[1] / 1e12:.1f} TFLOP/s; "
          f"int8 at 8192^3 (the best int8 rate) {rates[2] / 1e12:.1f} TOPS")
    ok = True
    for pair in args.pairs:
        for n_tokens in args.tokens:
            ok &= bench_pair(pair, n_tokens, args, rates, device)
    print(f"\n{'PASS' if ok else 'FAIL'}: all bounds" if ok else "\nFAIL: some bounds (above)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
