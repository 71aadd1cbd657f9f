"""Speed of streaming a layer's missing experts into device slots: the one-launch gather kernel (kernels/moe/
expert_gather.py, reading pinned host stacks through UVA) against the previous three copies an expert, beside the
pinned host-to-device copy rate (the PCIe floor), at the full-size qwen4exp expert (Q2_0, 2560 x 640: 1.32 MiB).

    python -m strata.bench.expert_gather [--experts 8,64,256] [--sweep] [--configs p132b2048w4,...]

Each line: GPU ms of one batch, GB/s and its fraction of the pinned copy rate, the host's microseconds to queue it
(what the prompt's layer loop pays), whether the slots' bytes equal the torch reference's, and with a matrix product
running beside it on another stream: how much the copy slows that product (the SMs a gather takes from the layer
computing beside it). `--sweep` times the launch configurations below, the default first.
"""

from __future__ import annotations

import argparse
import sys
import time
from types import SimpleNamespace

import numpy as np
import torch

import strata.kernels  # noqa: F401  (the interpreter switch, before Triton is imported)
from strata.bench.ceilings import Timer, host_to_device_bandwidth
from strata.engine.copy_queue import CopyQueue
from strata.kernels.moe.expert_gather import GatherConfig, gather_experts_ref, gather_experts_triton, gather_pairs
from strata.quant import get_format
from strata.quant.registry import Q2_0_TYPE

SWEEP = ["p132b2048w4", "p16b2048w4", "p32b2048w4", "p66b2048w4", "p264b2048w4", "p528b1024w4", "p132b1024w4",
         "p132b4096w8", "p66b4096w8", "p264b512w2", "p32b8192w8", "p1056b512w4"]


def _stack(n_experts: int, n_embd: int, n_ff: int, qtype: int, pinned: bool):
    fmt = get_format(qtype)
    shapes = {"gate": (n_ff, fmt.row_bytes(n_embd)), "up": (n_ff, fmt.row_bytes(n_embd)),
              "down": (n_embd, fmt.row_bytes(n_ff))}
    parts = {}
    for i, (name, (rows, row_bytes)) in enumerate(shapes.items()):
        raw = torch.empty((n_experts, rows, row_bytes), dtype=torch.uint8, pin_memory=pinned)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(i)))
        parts[name] = SimpleNamespace(raw=raw)
    expert_bytes = sum(p.raw[0].numel() for p in parts.values())
    return SimpleNamespace(**parts, n_experts=n_experts, expert_bytes=expert_bytes)


def _beside(fn, a: torch.Tensor, device) -> float:
    """How many times longer a matrix product takes while `fn` runs on another stream (1.00: not at all)."""
    side = torch.cuda.Stream(device, priority=-1)  # as the cache's copy stream
    timer = Timer(device)

    def product():
        for _ in range(4):
            a @ a

    alone = min(timer(product, 3) for _ in range(2))

    def both():
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            fn()
        product()
        torch.cuda.current_stream(device).wait_stream(side)

    together = min(timer(both, 3) for _ in range(2))
    return together / alone


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="strata bench expert-gather", description=__doc__.split("\n")[0])
    p.add_argument("--experts", default="8,64,256", help="experts a batch (a layer's misses), comma-separated")
    p.add_argument("--n-embd", type=int, default=2560)
    p.add_argument("--n-ff", type=int, default=640)
    p.add_argument("--sweep", action="store_true", help="time the launch configurations beside the default")
    p.add_argument("--configs", default="", help="comma-separated configs to time (instead of the sweep's)")
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("expert-gather: needs a CUDA GPU (the kernel's CPU tests are tests/kernels/moe/test_expert_gather.py)")
        return 2
    device = torch.device("cuda")
    counts = [int(v) for v in args.experts.split(",")]
    stack = _stack(max(counts), args.n_embd, args.n_ff, Q2_0_TYPE, pinned=True)
    pinned_rate = host_to_device_bandwidth(device)
    configs = [GatherConfig.parse(c) for c in args.configs.split(",")] if args.configs else \
        [GatherConfig.parse(c) for c in (SWEEP if args.sweep else SWEEP[:1])]
    timer = Timer(device)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)
    print(f"{torch.cuda.get_device_name(device)}; Q2_0 expert {stack.expert_bytes} bytes; pinned copy rate "
          f"{pinned_rate / 1e9:.1f} GB/s; 'beside' = a bf16 8192^3 product's time with the copy beside it / alone")
    for n in counts:
        experts = np.random.default_rng(n).permutation(stack.n_experts)[:n]
        targets = np.random.default_rng(n + 1).permutation(n)
        slots = torch.zeros((n, stack.expert_bytes), dtype=torch.uint8, device=device)
        want = torch.zeros_like(slots)
        gather_experts_ref(want, stack, torch.from_numpy(experts), torch.from_numpy(targets))
        n_bytes = n * stack.expert_bytes
        floor_ms = n_bytes / pinned_rate * 1e3
        print(f"{n} experts ({n_bytes / 2**20:.1f} MiB): floor {floor_ms:.3f} ms at the pinned copy rate")
        queue = CopyQueue(device)
        queue.per_part = True
        _line("copies x3 (previous)", lambda: _on_current(queue).gather(slots, stack, experts, targets), slots, want,
              n_bytes, pinned_rate, timer, args.reps, a, device)
        default_ms = None
        for config in configs:
            queue = CopyQueue(device)
            queue.per_part, queue.config = False, config
            ms = _line(f"gather {config.name()}", lambda: _on_current(queue).gather(slots, stack, experts, targets),
                       slots, want, n_bytes, pinned_rate, timer, args.reps, a, device)
            default_ms = default_ms or ms
            print(f"      {default_ms / ms:.2f}x default")
        pairs = gather_pairs(experts, targets).to(device)
        _line("gather kernel alone", lambda: gather_experts_triton(slots, stack, pairs, configs[0]), slots, want,
              n_bytes, pinned_rate, timer, args.reps, a, device)
    return 0


def _on_current(queue: CopyQueue) -> CopyQueue:
    """The queue copying on the caller's current stream (the timer's events and `_beside`'s side stream see it)."""
    queue.stream = torch.cuda.current_stream(queue.device)
    return queue


def _line(label, fn, slots, want, n_bytes, pinned_rate, timer, reps, a, device) -> float:
    slots.zero_()
    fn()
    torch.cuda.synchronize(device)
    same = torch.equal(slots, want)
    ms = min(timer(fn, reps) for _ in range(3))
    torch.cuda.synchronize(device)
    started = time.perf_counter()
    for _ in range(reps):
        fn()
    host_us = (time.perf_counter() - started) * 1e6 / reps
    torch.cuda.synchronize(device)
    slowdown = _beside(fn, a, device)
    rate = n_bytes / (ms * 1e-3)
    print(f"  {label:26} {ms:8.3f} ms  {rate / 1e9:6.1f} GB/s ({rate / pinned_rate:4.0%} of pinned)  host "
          f"{host_us:8.1f} us  beside {slowdown:.2f}x  bytes {'equal' if same else 'DIFFER'}", flush=True)
    return ms


if __name__ == "__main__":
    sys.exit(main())
