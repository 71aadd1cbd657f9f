"""Speed and parity of a GatedDeltaNet decode step's small kernels (kernels/pointwise/gdn_conv_step.py: the causal
conv + beta/g; gdn_out_gate.py: the output gate) against the torch lines they replace, at the Qwen3-30B-A3B shape
of qwen3next (8,192 conv channels, kernel 4, 32 value heads of 128): microseconds per call replayed from a CUDA
graph, and the largest difference from the torch form in units of the row's largest value.

    python -m strata.bench.gdn_step [--tokens 1] [--sweep]

`--sweep` times each kernel's launch configurations (channels a program and warps; heads a program and warps),
the default first, each line with its ratio to the default's time.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

import strata.kernels  # noqa: F401  (the interpreter switch, before Triton is imported)
from strata.bench.ceilings import graph_us
from strata.kernels.pointwise import gdn_conv_step, gdn_out_gate
from strata.models.gated_deltanet import causal_conv
from strata.models.layers import rms_norm

CONV_SWEEP = [(gdn_conv_step.BLOCK_CHANNELS, gdn_conv_step.NUM_WARPS), (128, 1), (128, 2), (256, 1), (256, 4),
              (512, 2), (512, 4), (1024, 4), (1024, 8), (64, 1)]
GATE_SWEEP = [(gdn_out_gate.HEADS_PER_PROGRAM, gdn_out_gate.NUM_WARPS), (1, 1), (1, 2), (2, 2), (2, 4), (4, 2),
              (8, 4), (8, 8), (16, 8), (32, 8)]
CALLS = 64  # calls per graph replay


def _diff(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-30)).item()


def bench_conv(n_tokens: int, channels: int, heads: int, device, sweep: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n_tokens, channels, generator=gen).bfloat16().to(device)
    weight = (torch.randn(channels, 4, generator=gen) * 0.5).bfloat16().to(device)
    past = torch.randn(3, channels, generator=gen).bfloat16().to(device)
    b, a = (torch.randn(n_tokens, heads, generator=gen).bfloat16().to(device) for _ in range(2))
    dt_bias = torch.randn(heads, generator=gen).bfloat16().to(device)
    decay = -torch.rand(heads, generator=gen).to(device)

    def torch_form():
        mixed, new_past = causal_conv(x, weight, past)
        past.copy_(new_past)  # what the caller's copy into the cache did
        return mixed, torch.sigmoid(b.float()), decay * F.softplus(a.float() + dt_bias.float())

    start = past.clone()
    want = causal_conv(x, weight, start)[0]
    torch_us = graph_us(torch_form, [()] * CALLS, device)
    print(f"conv + gates, {n_tokens} row(s) x {channels} channels, {heads} heads: torch {torch_us:7.2f} us")
    configs = CONV_SWEEP if sweep else CONV_SWEEP[:1]
    default_us = None
    for block, warps in configs:
        past.copy_(start)
        got = gdn_conv_step.conv_step_triton(x, weight, past, b, a, dt_bias, decay, block, warps)[0]
        us = graph_us(lambda c=(block, warps): gdn_conv_step.conv_step_triton(x, weight, past, b, a, dt_bias, decay,
                                                                                *c), [()] * CALLS, device)
        default_us = default_us or us
        print(f"  conv block_channels={block:<5} warps={warps:<2} {us:7.2f} us  {torch_us / us:5.2f}x torch  "
              f"{default_us / us:5.2f}x default  diff {_diff(got, want):.2e}")


def bench_gate(n_tokens: int, heads: int, dim: int, device, sweep: bool) -> None:
    gen = torch.Generator().manual_seed(1)
    out = torch.randn(n_tokens, heads, dim, generator=gen).bfloat16().to(device)
    z = torch.randn(n_tokens, heads, dim, generator=gen).bfloat16().to(device)
    weight = (1 + 0.1 * torch.randn(dim, generator=gen)).bfloat16().to(device)

    def torch_form():
        return (rms_norm(out, weight, 1e-6).float() * F.silu(z.float())).to(out.dtype)

    want = torch_form()
    torch_us = graph_us(torch_form, [()] * CALLS, device)
    print(f"output gate, {n_tokens} row(s) x {heads} heads x {dim}: torch {torch_us:7.2f} us")
    default_us = None
    for rows, warps in GATE_SWEEP if sweep else GATE_SWEEP[:1]:
        got = gdn_out_gate.out_gate_triton(out, weight, z, 1e-6, False, rows, warps)
        us = graph_us(lambda c=(rows, warps): gdn_out_gate.out_gate_triton(out, weight, z, 1e-6, False, *c),
                      [()] * CALLS, device)
        default_us = default_us or us
        print(f"  gate heads_per_program={rows:<3} warps={warps:<2} {us:7.2f} us  {torch_us / us:5.2f}x torch  "
              f"{default_us / us:5.2f}x default  diff {_diff(got, want):.2e}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="strata bench gdn-step", description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=1, help="rows a step (1: decode; up to 8)")
    p.add_argument("--channels", type=int, default=8192)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--sweep", action="store_true", help="time each kernel's launch configurations beside the default")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("gdn-step: needs a CUDA GPU (the kernels' CPU tests are tests/kernels/pointwise/test_gdn_step_kernels.py)")
        return 2
    device = torch.device("cuda")
    print(torch.cuda.get_device_name(device) + "; diff = max|kernel - torch| / max|torch| (bf16)")
    bench_conv(args.tokens, args.channels, args.heads, device, args.sweep)
    bench_gate(args.tokens, args.heads, args.head_dim, device, args.sweep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
