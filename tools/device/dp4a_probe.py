"""On the GPU (issue 4): does an int8-activation dp4a one-shot matvec (`strata/kernels/moe/dp4a_gemv.py`) cut A3B's
Q4_0 decode GEMVs from the float one-shot kernels' time toward the bare read of their weights?

Shapes (Qwen3-30B-A3B, every matrix Q4_0): q/k/v stacked 5120 x 2048 (also a 4-row verify window), o 2048 x 4096,
the experts' gate/up (8 chosen experts x 768 x 2048, both operands) and down (8 x 2048 x 768) for one token. Each
variant runs as a chain of CHAIN launches over distinct copies of the weights in one CUDA graph, after a fill that
evicts L2 (its own graph's time subtracted), and is printed per launch:
  reader       session 10's plain reader kernel (l2_prefetch_probe: one burst of loads a program, a sum) over the
               same bytes: the floor these kernels approach;
  oneshot      the engine's kernel today (quant_matvec / gate_up_swiglu_triton / down_sum_triton, default tiles);
  dp4a         the dp4a kernel (its default layout, pairs), the activation quantized beforehand (as if the norm
               kernel wrote the codes);
  dp4a+quant   the same after its own quantize launch (the cost if nothing fuses the quantization);
  dp4a blocks / dp4a halfwords   its other layouts (dp4a_gemv.LAYOUTS): halfwords (coalesced loads, ~2x the
               instructions) faster than the others only if their strided loads bind in the L1;
  --sweep      dp4a pairs and blocks at each (rows, warps) tile, beside the default ("*").
Each line: us a launch, GB/s of weights read against the device copy rate (read + write, as
l2_prefetch_probe.copy_rate measures), and the error against float64: the float kernels' max |err| / max |float64|
beside gemv.ERROR_BOUND, the dp4a kernels' max |err| beside their bound (`dp4a_gemv.row_error_bound`: x rounded to
int8; "ok" when every row is within). If the idea pays, dp4a shows ~3.7-4.5 us on the 4.7 MB o matvec (one-shot:
5.0 us in session 6's sweep, 6.1 under Nsight; a plain reader kernel of 4.7 MB takes 3.7 us in a graph, session 10)
and gate/up and down well under the one-shot lines (9.6 / 6.8 us in session 6's sweep). If dp4a is no faster
although its instructions are a third, the time is latency / the L1, not issue: then halfwords tells which.

Usage: python3 tools/device/dp4a_probe.py [--sweep] [--chain 16] [--shapes qkv,qkv4,o,gate_up,down]
Without a GPU (a smoke run of every path and check at tiny shapes under Triton's interpreter, no timing):
    TRITON_INTERPRET=1 python3 tools/device/dp4a_probe.py --tiny --chain 2
"""

import argparse
import dataclasses
import math
import time

import numpy as np
import torch

from strata.bench.ceilings import copy_bandwidth
from strata.kernels.moe import dp4a_gemv as dp
from strata.kernels.moe.gemv import ERROR_BOUND, DecodeExperts, down_sum_triton, gate_up_swiglu_triton
from strata.kernels.quant.matvec import quant_matvec
from strata.quant import dequantize, get_format, random_blocks

Q4_0 = get_format("Q4_0")
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def chain_us(launch, n: int, flush: torch.Tensor, reps: int = 15) -> float:
    """us a launch of launch(0..n-1) replayed in one graph after an L2-evicting fill, the fill's time subtracted
    (on the CPU: each launch run once, no time)."""
    if DEV.type == "cpu":
        for i in range(n):
            launch(i)
        return float("nan")
    launch(0)  # compiles
    torch.cuda.synchronize()

    def body(with_chain: bool):
        flush.fill_(1)
        if with_chain:
            for i in range(n):
                launch(i)

    from l2_prefetch_probe import replay_ms  # (this file's folder is on the path when run as a script)

    times = []
    for with_chain in (False, True):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            body(with_chain)
        times.append(replay_ms(graph, reps))
    return (times[1] - times[0]) * 1e3 / n


def reader(n_bytes: int, chain: int, programs: int = 256):
    """Launches of l2_prefetch_probe's reader over `chain` distinct buffers of n_bytes (its default 256 programs)."""
    from l2_prefetch_probe import _reader  # (this file's folder is on the path when run as a script)

    words = int(n_bytes / 4 / programs) // 4 * 4
    bufs = [torch.randint(-100, 100, (programs * words,), dtype=torch.int32, device=DEV) for _ in range(chain)]
    out = torch.empty(programs, dtype=torch.float32, device=DEV)
    block = 1 << (words - 1).bit_length()
    return lambda i: _reader[(programs,)](bufs[i], out, bufs[i], words * 4, words, block, False, num_warps=4)


def q4_0(rows: int, cols: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random Q4_0 bytes (uint8 flat, on the GPU) and their float64 values [rows, cols]."""
    gen = np.random.default_rng(seed)
    raw = torch.from_numpy(random_blocks("Q4_0", rows * cols // 32, gen, 0.02)).reshape(-1).to(DEV)
    return raw, dequantize(raw.reshape(rows, -1), Q4_0.ggml_type, (rows, cols)).double()


def dp4a_check(got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor) -> str:
    err = (got.double() - want).abs()
    ok = "ok" if bool((err <= bound).all()) else "OUTSIDE"
    rel = err.max().item() / max(want.abs().max().item(), 1e-30)
    return (f"max err {err.max().item():.2e} bound {bound.min().item():.2e}..{bound.max().item():.2e} {ok} "
            f"(rel {rel:.1e})")


def float_check(got: torch.Tensor, want: torch.Tensor) -> str:
    rel = (got.double() - want).abs().max().item() / max(want.abs().max().item(), 1e-30)
    return f"rel err {rel:.1e} (bound {ERROR_BOUND:.0e}) {'ok' if rel <= ERROR_BOUND else 'OUTSIDE'}"


class Matvec:
    """One dense Q4_0 matrix n_out x k times `rows` activation rows (bf16, as the engine's)."""

    def __init__(self, name: str, n_out: int, k: int, rows: int, chain: int):
        self.name, self.n_out, self.k, self.rows = name, n_out, k, rows
        raw, self.w64 = q4_0(n_out, k, seed=n_out + k)
        self.copies = [raw.clone() for _ in range(chain)]
        self.x = torch.randn(rows, k, generator=torch.Generator().manual_seed(1)).to(DEV, torch.bfloat16)
        self.xq = dp.quantize_x(self.x)
        self.y = torch.empty(rows, n_out, dtype=torch.float32, device=DEV)
        self.bytes = raw.numel()
        self.units, self.programs, self.operands = k // 32, 1, 1

    def want(self) -> torch.Tensor:
        return self.x.double() @ self.w64.T

    def oneshot(self, i: int):
        return quant_matvec(self.x, self.copies[i].view(self.n_out, -1), Q4_0.ggml_type, (self.n_out, self.k))

    def dp4a(self, i: int, bn=None, warps=None, quantize=False, layout=None):
        if quantize:
            dp.quantize_x(self.x, out=self.xq)
        return dp.dp4a_matvec(self.xq, self.copies[i], self.n_out, self.y, bn, warps, layout)

    def checks(self) -> tuple[str, str]:
        want = self.want()
        old = quant_matvec(self.x.float(), self.copies[0].view(self.n_out, -1), Q4_0.ggml_type, (self.n_out, self.k))
        return float_check(old, want), dp4a_check(
            self.dp4a(0), want, dp.row_error_bound(self.w64, self.x, self.xq))


class Experts:
    """A3B's 8 chosen experts for one token: gate/up (both operands) or down."""

    def __init__(self, name: str, embd: int, ff: int, top_k: int, chain: int):
        from strata.bench.moe_decode import synthetic_stack

        self.name, self.embd, self.ff, self.top_k = name, embd, ff, top_k
        stack = synthetic_stack("Q4_0", "Q4_0", top_k, embd, ff, seed=7, device=DEV)
        experts = DecodeExperts.of_stack(stack)
        self.copies = [DecodeExperts(*(dataclasses.replace(op, raw=op.raw.clone())
                                       for op in (experts.gate, experts.up, experts.down))) for _ in range(chain)]
        gen = torch.Generator().manual_seed(2)
        self.ids = torch.randperm(top_k, generator=gen)[None, :].int().to(DEV)
        self.weights = torch.softmax(torch.randn(1, top_k, generator=gen), dim=-1).to(DEV)
        self.x = torch.randn(1, embd, generator=gen).to(DEV, torch.bfloat16)
        self.h = (torch.randn(1, top_k, ff, generator=gen) * 0.05).to(DEV)
        self.xq = dp.quantize_x(self.x)
        self.hq = dp.quantize_x(self.h.reshape(top_k, ff))
        self.y = torch.empty(1, embd, dtype=torch.float32, device=DEV)
        self.w64 = {part: dequantize(op.raw.reshape(top_k * op.rows, -1), Q4_0.ggml_type,
                                     (top_k * op.rows, op.cols)).double().reshape(top_k, op.rows, op.cols)
                    for part, op in (("gate", experts.gate), ("up", experts.up), ("down", experts.down))}
        if name == "gate_up":
            self.bytes = 2 * experts.gate.raw.numel()
            self.units, self.programs, self.operands = embd // 32, top_k, 2
        else:
            self.bytes = experts.down.raw.numel()
            self.units, self.programs, self.operands = top_k * ff // 32, 1, 1
        self.n_out = ff if name == "gate_up" else embd

    def oneshot(self, i: int):
        e = self.copies[i]
        if self.name == "gate_up":
            return gate_up_swiglu_triton(self.x, self.ids, e)
        return down_sum_triton(self.h, self.ids, self.weights, e)

    def dp4a(self, i: int, bn=None, warps=None, quantize=False, swiglu=True, layout=None):
        e = self.copies[i]
        if self.name == "gate_up":
            if quantize:
                dp.quantize_x(self.x, out=self.xq)
            return dp.dp4a_gate_up(self.xq, self.ids, e.gate.raw, e.up.raw, e.gate.stride, self.ff, swiglu, bn, warps,
                                   layout)
        if quantize:
            dp.quantize_x(self.h.reshape(self.top_k, self.ff), out=self.hq)
        return dp.dp4a_down(self.hq, self.ids, self.weights, e.down.raw, e.down.stride, self.embd, self.y, bn, warps,
                            layout)

    def checks(self) -> tuple[str, str]:
        ids = self.ids[0].tolist()
        if self.name == "gate_up":
            x = self.x.double()
            g = torch.stack([x[0] @ self.w64["gate"][e].T for e in ids])
            u = torch.stack([x[0] @ self.w64["up"][e].T for e in ids])
            old = float_check(self.oneshot(0)[0], g * torch.sigmoid(g) * u)
            dots = self.dp4a(0, swiglu=False)
            notes = [dp4a_check(dots[0], g, torch.cat([dp.row_error_bound(self.w64["gate"][e], self.x, self.xq)
                                                       for e in ids])),
                     dp4a_check(dots[1], u, torch.cat([dp.row_error_bound(self.w64["up"][e], self.x, self.xq)
                                                       for e in ids]))]
            return old, "gate " + notes[0] + "; up " + notes[1]
        h = self.h[0].double()
        w = self.weights[0].double()
        want = sum(w[j] * (h[j] @ self.w64["down"][e].T) for j, e in enumerate(ids))[None, :]
        terms = 1 << (self.units - 1).bit_length()
        bound = sum(w[j] * dp.row_error_bound(self.w64["down"][e], self.h[0, j:j + 1], tuple(
            t[j:j + 1] for t in self.hq), terms=8 * terms + 1) for j, e in enumerate(ids))
        return float_check(self.oneshot(0), want), dp4a_check(self.dp4a(0), want, bound)


def sweep_tiles(case, default: tuple[int, int]) -> list[tuple[int, int]]:
    """(rows, warps) tiles whose threads hold 2..16 block rows each, the default's nearest first (a sweep cut by
    the time budget keeps the likeliest ones)."""
    nu = 1 << (case.units - 1).bit_length()
    tiles = []
    for bn in (1, 2, 4, 8, 16, 32):
        for warps in (2, 4, 8, 16):
            blocks = case.operands * nu * bn / (32 * warps)
            if 2 <= blocks <= 16 and bn <= case.n_out:
                tiles.append((bn, warps))

    def distance(tile):
        return abs(math.log2(tile[0] / default[0])) + abs(math.log2(tile[1] / default[1]))

    return sorted(tiles, key=distance)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--chain", type=int, default=16)
    p.add_argument("--shapes", default="qkv,qkv4,o,gate_up,down")
    p.add_argument("--tiny", action="store_true", help="small shapes (a CPU smoke run of every path)")
    p.add_argument("--budget", type=float, default=200, help="seconds by which the sweep stops (said)")
    args = p.parse_args()
    started = time.monotonic()
    rate = copy_bandwidth(DEV, 1 << (30 if DEV.type == "cuda" else 24))
    name = torch.cuda.get_device_name() if DEV.type == "cuda" else "CPU (interpreter: no timing)"
    print(f"{name}: copy rate {rate / 1e12:.2f} TB/s (read + write); chain of {args.chain}")
    flush = torch.empty(256 << 20 if DEV.type == "cuda" else 1, dtype=torch.uint8, device=DEV)
    s = 16 if args.tiny else 1  # tiny: every size / 16 (the experts' top-k kept)
    makers = {"qkv": lambda: Matvec("qkv", 5120 // s, 2048 // s, 1, args.chain),
              "qkv4": lambda: Matvec("qkv x4", 5120 // s, 2048 // s, 4, args.chain),
              "o": lambda: Matvec("o", 2048 // s, 4096 // s, 1, args.chain),
              "gate_up": lambda: Experts("gate_up", 2048 // s, 768 // s * 4, 8, args.chain),
              "down": lambda: Experts("down", 2048 // s, 768 // s * 4, 8, args.chain)}
    shapes = args.shapes.split(",")
    swept = [shape for shape in shapes if shape != "qkv4"] if args.sweep else []
    # First every shape's comparison, then the sweeps (each shape an equal share of what is left of the budget)
    for sweep, names in ((False, shapes), (True, swept)):
        share_start = time.monotonic()
        for n, shape in enumerate(names):
            case = makers[shape]()
            floor = case.bytes / rate * 1e6
            default = dp.dp4a_tile(case.n_out, case.units, case.programs, case.operands, True)

            def line(label: str, us: float, note: str = ""):
                print(f"  {label:24s} {us:7.2f} us {case.bytes / us / 1e3:7.0f} GB/s {floor / us:6.1%} of copy  "
                      f"{note}", flush=True)

            if not sweep:
                print(f"\n{case.name}: {case.bytes / 1e6:.2f} MB of weights a launch, copy-rate floor {floor:.2f} us; "
                      f"dp4a default tile rows {default[0]} warps {default[1]}")
                old_check, new_check = case.checks()
                line("reader", chain_us(reader(case.bytes, args.chain), args.chain, flush), "(no arithmetic)")
                line("oneshot", chain_us(case.oneshot, args.chain, flush), old_check)
                line("dp4a", chain_us(case.dp4a, args.chain, flush), new_check)
                line("dp4a+quant", chain_us(lambda i: case.dp4a(i, quantize=True), args.chain, flush))
                for layout in ("blocks", "halfwords"):
                    line(f"dp4a {layout}", chain_us(lambda i: case.dp4a(i, layout=layout), args.chain, flush))
            else:
                deadline = share_start + (n + 1) * (args.budget - (share_start - started)) / len(names)
                print(f"\n{case.name} sweep (* the default):")
                for bn, warps, layout in [(bn, warps, layout) for bn, warps in sweep_tiles(case, default)
                                          for layout in ("pairs", "blocks")]:
                    if time.monotonic() > deadline:
                        print("  (this shape's share of --budget is spent: the farther tiles left out)")
                        break
                    try:
                        us = chain_us(lambda i: case.dp4a(i, bn, warps, layout=layout), args.chain, flush)
                    except Exception as e:  # a tile the compiler refuses (shared memory, registers): said
                        print(f"  dp4a {layout} rows {bn} warps {warps}: {type(e).__name__}: {str(e)[:120]}")
                        continue
                    star = "*" if (bn, warps) == default and layout == "pairs" else " "
                    line(f"{layout:6s} rows {bn:2d} warps {warps:2d} {star}", us)
            del case
            if DEV.type == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
