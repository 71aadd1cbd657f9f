"""Speed and parity of qwen4exp's hyper-connection read on few rows (kernels/hc: write + statistics, down + inject,
up + gate + mix; the previous write folded in) against the torch reference it replaces (models/hyper_connections.py:
hc_write then hc_read, about 25 launches), at the full shape (embd 2,560, hc 4, rank 320, BF16 weights): microseconds
per read replayed from a CUDA graph, the weights' HBM floor, and the largest error against float64.

    python -m strata.bench.hc_read [--rows 1,4] [--prompt 4096] [--sweep]

`--prompt T` also times a prompt chunk's read of T rows: torch against the two row-wise kernels around the same
GEMMs (models/hyper_connections.py `_read_many_rows`).

`--sweep` also times each kernel alone under its launch configurations at the first row count (the decode step's),
the default first, each with its ratio to the default's time.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

import strata.kernels  # noqa: F401  (the interpreter switch, before Triton is imported)
from strata.bench.ceilings import copy_bandwidth, graph_us
from strata.kernels.hc import down_inject, up_mix, write_stats
from strata.kernels.hc.read import hc_read_triton
from strata.models.hyper_connections import HyperConnectionWeights, hc_read
from strata.models.weights import QuantWeight

STATS_SWEEP = [write_stats.NUM_WARPS, 1, 2, 8]
# (rows a program, inputs a step, warps, stages, unrolled)
DOWN_SWEEP = [(down_inject.BLOCK_N, down_inject.BLOCK_K, down_inject.NUM_WARPS, down_inject.NUM_STAGES,
               down_inject.UNROLL),
              (2, 2048, 4, 3, True), (1, 2048, 4, 3, False), (1, 2048, 4, 3, True), (2, 1024, 4, 3, False),
              (2, 1024, 4, 3, True), (2, 2048, 8, 3, False), (2, 2048, 4, 1, False), (4, 1024, 4, 3, False),
              (4, 2048, 8, 3, True), (8, 512, 4, 3, False), (2, 4096, 8, 2, False)]
UP_SWEEP = [(up_mix.BLOCK_E, up_mix.NUM_WARPS), (4, 1), (4, 2), (8, 2), (8, 4), (16, 2), (16, 8), (32, 4), (32, 8),
            (64, 8)]
CALLS = 32  # reads per graph replay
EPS = 1e-6


def _bf16_weight(name: str, t: torch.Tensor) -> QuantWeight:
    t = t.to(torch.bfloat16).contiguous()
    return QuantWeight(name, 30, tuple(t.shape), t.view(torch.uint8).reshape(t.shape[0], -1))


def _inputs(rows: int, embd: int, hc: int, rank: int, device):
    gen = torch.Generator().manual_seed(0)
    width = hc * embd
    w = HyperConnectionWeights(
        norm=(1 + 0.2 * torch.randn(width, generator=gen)).to(device),
        down=_bf16_weight("down", torch.randn(rank, width, generator=gen) * width ** -0.5).to(device),
        up=_bf16_weight("up", torch.randn(width, rank, generator=gen) * rank ** -0.5).to(device),
        inject=_bf16_weight("inject", torch.randn(hc, width, generator=gen) * width ** -0.5).to(device))
    residual = torch.randn(rows, hc, embd, generator=gen).to(device)
    pending = (torch.randn(rows, embd, generator=gen).bfloat16().to(device),
               torch.randn(rows, hc, generator=gen).to(device))
    return w, residual, pending


def _float64_read(residual, pending, w, hc, embd):
    x = residual.double() + pending[0].double()[:, None, :] * (2 * torch.sigmoid(pending[1].double() / hc))[:, :, None]
    xn = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + EPS) * w.norm.double().view(hc, embd)
    flat = xn.flatten(1)
    low = F.silu(flat @ w.down.dequantize(torch.float64).T / hc)
    gate = torch.sigmoid(low @ w.up.dequantize(torch.float64).T).view_as(xn)
    return (xn * gate).mean(1), flat @ w.inject.dequantize(torch.float64).T


def _err(got, want) -> float:
    return ((got.double() - want).abs().max() / want.abs().max()).item()


def bench_rows(rows: int, embd: int, hc: int, rank: int, device, bandwidth: float, sweep: bool) -> None:
    w, residual, pending = _inputs(rows, embd, hc, rank, device)
    mats = [m.dequantize(torch.bfloat16) for m in (w.down, w.up, w.inject)]
    floor_us = sum(m.numel() * 2 for m in mats) / bandwidth * 1e6

    def torch_form():  # hc_write's own lines: on a GPU hc_write itself now takes the write kernel
        gate = 2 * torch.sigmoid(pending[1].float() / hc)
        mixed, inject = hc_read(residual + pending[0].float()[:, None, :] * gate[:, :, None], w, EPS)
        return mixed.to(torch.bfloat16), inject

    def fused():
        return hc_read_triton(residual, w.norm, *mats, EPS, torch.bfloat16, pending)

    exact_mixed, exact_inject = _float64_read(residual, pending, w, hc, embd)
    _, mixed, inject = fused()
    torch_us, fused_us = graph_us(torch_form, [()] * CALLS, device), graph_us(fused, [()] * CALLS, device)
    print(f"{rows} row(s): torch {torch_us:7.2f} us, kernels {fused_us:7.2f} us ({torch_us / fused_us:4.2f}x), "
          f"weights' HBM floor {floor_us:5.2f} us; vs float64: mixed (bf16) {_err(mixed, exact_mixed):.1e}, "
          f"inject {_err(inject, exact_inject):.1e}")
    if not sweep:
        return
    _, _, xn = write_stats.write_stats_triton(residual, EPS, *pending, norm=w.norm)
    lo, _ = down_inject.down_inject_triton(xn, mats[0], mats[2])
    default = None
    for warps in STATS_SWEEP:
        us = graph_us(lambda: write_stats.write_stats_triton(residual, EPS, *pending, num_warps=warps, norm=w.norm),
                      [()] * CALLS, device)
        default = default or us
        print(f"  write+stats warps={warps:<2}                     {us:7.2f} us  {default / us:5.2f}x default")
    default = None
    for block_n, block_k, warps, stages, unroll in DOWN_SWEEP:
        got, got_inject = down_inject.down_inject_triton(xn, mats[0], mats[2], block_n, block_k, warps, stages,
                                                         unroll)
        ok = torch.allclose(got, lo, rtol=1e-4, atol=1e-5) and _err(got_inject, exact_inject) < 1e-4
        us = graph_us(lambda c=(block_n, block_k, warps, stages, unroll): down_inject.down_inject_triton(
            xn, mats[0], mats[2], *c), [()] * CALLS, device)
        default = default or us
        print(f"  down+inject n={block_n:<2} k={block_k:<5} warps={warps:<2} stages={stages} unroll={int(unroll)} "
              f"{us:7.2f} us  "
              f"{default / us:5.2f}x default  {'ok' if ok else 'WRONG'}")
    default = None
    for block_e, warps in UP_SWEEP:
        got = up_mix.up_mix_triton(xn, mats[1], lo, torch.bfloat16, block_e, warps)
        ok = torch.equal(got, mixed) or _err(got, exact_mixed) < 2 ** -7
        us = graph_us(lambda c=(block_e, warps): up_mix.up_mix_triton(xn, mats[1], lo, torch.bfloat16, *c),
                      [()] * CALLS, device)
        default = default or us
        print(f"  up+mix block_e={block_e:<3} warps={warps:<2}              {us:7.2f} us  "
              f"{default / us:5.2f}x default  {'ok' if ok else 'WRONG'}")


def bench_prompt(rows: int, embd: int, hc: int, rank: int, device) -> None:
    """A prompt chunk's read: torch's passes against the two row-wise kernels around the same GEMMs, those GEMMs on
    TF32 tensor cores (the default) and in float32 (STRATA_HC_FP32), each against float64."""
    from strata import switches
    from strata.models.hyper_connections import _read_many_rows

    w, residual, pending = _inputs(rows, embd, hc, rank, device)
    exact_mixed, exact_inject = _float64_read(residual, pending, w, hc, embd)

    def torch_form():
        gate = 2 * torch.sigmoid(pending[1].float() / hc)
        mixed, inject = hc_read(residual + pending[0].float()[:, None, :] * gate[:, :, None], w, EPS)
        return mixed.to(torch.bfloat16), inject

    want, want_inject = torch_form()
    torch_us = graph_us(torch_form, [()] * 2, device)
    print(f"prompt, {rows} rows: torch {torch_us / 1e3:7.3f} ms; vs float64: mixed (bf16) "
          f"{_err(want, exact_mixed):.1e}, inject {_err(want_inject, exact_inject):.1e}")
    for label, fp32 in (("GEMMs on TF32 + row-wise kernels (default)", False),
                        ("GEMMs in float32 + row-wise kernels (STRATA_HC_FP32)", True)):
        with switches.override(STRATA_HC_FP32=fp32):
            _, got, inject = _read_many_rows(residual, w, EPS, pending, torch.bfloat16)
            us = graph_us(lambda: _read_many_rows(residual, w, EPS, pending, torch.bfloat16), [()] * 2, device)
        print(f"  {label:52} {us / 1e3:7.3f} ms ({torch_us / us:4.2f}x torch); vs float64: mixed (bf16) "
              f"{_err(got, exact_mixed):.1e}, inject {_err(inject, exact_inject):.1e}; mixed vs torch "
              f"{_err(got, want.double()):.1e}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="strata bench hc-read", description=__doc__.split("\n")[0])
    p.add_argument("--rows", default="1,4", help="rows a read (1: decode; up to 4, a verify window)")
    p.add_argument("--embd", type=int, default=2560)
    p.add_argument("--hc", type=int, default=4)
    p.add_argument("--rank", type=int, default=320)
    p.add_argument("--prompt", type=int, default=4096, help="rows of the prompt read timed (0: none)")
    p.add_argument("--sweep", action="store_true", help="time each kernel's launch configurations beside the default")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("hc-read: needs a CUDA GPU (the kernels' CPU tests are tests/kernels/pointwise/test_hc_kernels.py)")
        return 2
    device = torch.device("cuda")
    bandwidth = copy_bandwidth(device)
    print(f"{torch.cuda.get_device_name(device)}; copy bandwidth {bandwidth / 1e9:.0f} GB/s; error = max|x - float64| "
          f"/ max|float64|")
    for j, rows in enumerate(int(r) for r in args.rows.split(",")):
        bench_rows(rows, args.embd, args.hc, args.rank, device, bandwidth, args.sweep and j == 0)
    if args.prompt:
        bench_prompt(args.prompt, args.embd, args.hc, args.rank, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
