"""Speed of streaming a layer's missing experts into device slots, in each form STRATA_PF_STREAM offers: the one-launch
gather kernel (kernels/moe/expert_gather.py, reading pinned host stacks through UVA; `gather-hi`: on a stream of the
highest priority), the copy engines (`dma`: runs of experts consecutive in the stacks and the slots, three strided
cudaMemcpy2DAsync a run; `dma1d`: one copy an expert part), and the previous three copies an expert, beside the
pinned host-to-device copy rate (the PCIe floor), at the full-size qwen4exp expert (Q2_0, 2560 x 640: 1.32 MiB).

    python -m strata.bench.expert_gather [--experts 64,256,512] [--present 0.12] [--sweep] [--configs p132b2048w4,...]

A batch is n missing experts in expert order with ~`present` of the layer already on the device between them (runs
broken by gaps, as at a 12 GiB budget), into consecutive slots (as the ring places them). Each line: GPU ms of one
batch alone, GB/s and its fraction of the pinned rate, the host's microseconds to queue it (what the prompt's layer
loop pays), whether the slots' bytes equal the torch reference's; then with a bf16 matrix product running on the
compute stream as long as the copy needs: how many times longer the product takes ("slows"; the SMs a gather takes
from the layer computing beside it) and the copy's own GB/s meanwhile ("beside"). `--sweep` also times the gather
kernel's launch configurations below, the default first. The last line of a batch copies its whole span as one run
(the present experts again): its GB/s counts the batch's bytes only, so it says whether bridging gaps would pay.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from types import SimpleNamespace

import numpy as np
import torch

import strata.kernels  # noqa: F401  (the interpreter switch, before Triton is imported)
from strata import switches
from strata.bench.ceilings import Timer, host_to_device_bandwidth
from strata.engine.copy_queue import COPY_STREAM_PRIORITY, HIGHEST_PRIORITY, CopyQueue
from strata.engine.copy_runs import group_runs
from strata.kernels.moe.expert_gather import GatherConfig, gather_experts_ref
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


def batch(n: int, present: float, n_experts: int, seed: int) -> np.ndarray:
    """n experts in ascending order, each expert of the layer skipped (already present) with probability `present`."""
    rng = np.random.default_rng(seed)
    missing = np.flatnonzero(rng.random(n_experts) >= present)
    return missing[:n]


class Beside:
    """A matrix product on the compute stream while a copy runs on a side stream: how many times longer the product
    takes than alone, and the copy's own milliseconds meanwhile (the product is repeated to outlast the copy)."""

    def __init__(self, device, product_n: int = 8192):
        self.device = device
        self.a = torch.randn(product_n, product_n, dtype=torch.bfloat16, device=device)
        self.one_ms = min(Timer(device)(lambda: self.a @ self.a, 3) for _ in range(2))

    def __call__(self, fn, copy_ms: float, priority: int, reps: int = 3) -> tuple[float, float]:
        side = torch.cuda.Stream(self.device, priority=priority)
        current = torch.cuda.current_stream(self.device)
        n_products = max(4, math.ceil(1.5 * copy_ms / self.one_ms))

        def product():
            for _ in range(n_products):
                self.a @ self.a

        timer = Timer(self.device)
        alone = min(timer(product, 2) for _ in range(2))
        together, copy_beside = [], []
        for _ in range(reps):
            events = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
            torch.cuda.synchronize(self.device)
            events[0].record(current)
            side.wait_stream(current)
            with torch.cuda.stream(side):
                events[2].record(side)
                fn()
                events[3].record(side)
            product()
            events[1].record(current)
            torch.cuda.synchronize(self.device)
            together.append(events[0].elapsed_time(events[1]))
            copy_beside.append(events[2].elapsed_time(events[3]))
        return min(together) / alone, min(copy_beside)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="strata bench expert-gather", description=__doc__.split("\n")[0])
    p.add_argument("--experts", default="64,256,512", help="experts a batch (a layer's misses), comma-separated")
    p.add_argument("--present", type=float, default=0.12, help="share of the layer already on the device (gaps)")
    p.add_argument("--n-embd", type=int, default=2560)
    p.add_argument("--n-ff", type=int, default=640)
    p.add_argument("--sweep", action="store_true", help="time the gather kernel's launch configurations too")
    p.add_argument("--configs", default="", help="comma-separated gather configs to time (instead of the sweep's)")
    p.add_argument("--no-copies", action="store_true", help="leave out the previous three copies an expert")
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("expert-gather: needs a CUDA GPU (the CPU tests: tests/kernels/moe/test_expert_gather.py, "
              "tests/engine/test_copy_runs.py)")
        return 2
    device = torch.device("cuda")
    counts = [int(v) for v in args.experts.split(",")]
    n_stack = math.ceil(max(counts) / (1 - args.present) * 1.1) + 8  # the largest batch finds its experts
    stack = _stack(n_stack, args.n_embd, args.n_ff, Q2_0_TYPE, pinned=True)
    pinned_rate = host_to_device_bandwidth(device)
    configs = [GatherConfig.parse(c) for c in args.configs.split(",")] if args.configs else \
        [GatherConfig.parse(c) for c in (SWEEP if args.sweep else SWEEP[:1])]
    beside = Beside(device)
    print(f"{torch.cuda.get_device_name(device)}; Q2_0 expert {stack.expert_bytes} bytes; pinned copy rate "
          f"{pinned_rate / 1e9:.1f} GB/s; batches in expert order, ~{args.present:.0%} of the layer present between "
          f"them, into consecutive slots; 'slows' = a bf16 product's time with the copy beside it / alone, 'beside' "
          f"= the copy's rate meanwhile")
    for n in counts:
        experts = batch(n, args.present, n_stack, seed=n)
        targets = np.arange(len(experts))
        slots = torch.zeros((len(experts), stack.expert_bytes), dtype=torch.uint8, device=device)
        want = torch.zeros_like(slots)
        gather_experts_ref(want, stack, torch.from_numpy(experts), torch.from_numpy(targets))
        n_bytes = len(experts) * stack.expert_bytes
        runs = group_runs(experts, targets)
        print(f"{len(experts)} experts ({n_bytes / 2**20:.1f} MiB, {len(runs)} runs): floor "
              f"{n_bytes / pinned_rate * 1e3:.3f} ms at the pinned copy rate", flush=True)
        line = Line(slots, want, n_bytes, pinned_rate, args.reps, beside)

        def form(name, **fields):
            with switches.override(STRATA_PF_STREAM=name):
                queue = CopyQueue(device)
            for k, v in fields.items():
                setattr(queue, k, v)
            return lambda: _on_current(queue).gather(slots, stack, experts, targets), queue

        if not args.no_copies:
            fn, _ = form("gather", per_part=True)
            line("copies x3 (previous)", fn)
        default_ms = None
        for config in configs:
            fn, _ = form("gather", config=config)
            ms = line(f"gather {config.name()}", fn)
            default_ms = default_ms or ms
            if len(configs) > 1:
                print(f"      {default_ms / ms:.2f}x default")
        fn, _ = form("gather-hi", config=configs[0])
        line(f"gather-hi {configs[0].name()}", fn, priority=HIGHEST_PRIORITY)
        for name in ("dma", "dma1d"):
            fn, queue = form(name)
            before = queue.copies
            line(name, fn)
            calls = (queue.copies - before) // max(queue.launches, 1)
            print(f"      {calls} copy calls a batch, by {queue.copied_by}")
        # The gaps bridged: the batch's whole span as one run, the present experts copied again (wasted link time);
        # GB/s counts the batch's bytes only, so against dma's line it says whether merging runs across gaps pays.
        span = np.arange(experts[0], experts[-1] + 1)
        span_slots = torch.zeros((len(span), stack.expert_bytes), dtype=torch.uint8, device=device)
        span_want = torch.zeros_like(span_slots)
        gather_experts_ref(span_want, stack, torch.from_numpy(span), torch.arange(len(span)))
        with switches.override(STRATA_PF_STREAM="dma"):
            queue = CopyQueue(device)
        bridged = Line(span_slots, span_want, n_bytes, pinned_rate, args.reps, beside)
        bridged(f"dma, gaps bridged ({len(span) - len(experts)} more)",
                lambda: _on_current(queue).gather(span_slots, stack, span, np.arange(len(span))))
        del span_slots, span_want
    return 0


def _on_current(queue: CopyQueue) -> CopyQueue:
    """The queue copying on the caller's current stream (the timer's events and the side stream see it)."""
    queue.stream = torch.cuda.current_stream(queue.device)
    return queue


class Line:
    def __init__(self, slots, want, n_bytes, pinned_rate, reps, beside: Beside):
        self.slots, self.want, self.n_bytes, self.pinned_rate = slots, want, n_bytes, pinned_rate
        self.reps, self.beside = reps, beside
        self.timer = Timer(slots.device)

    def __call__(self, label, fn, priority: int = COPY_STREAM_PRIORITY) -> float:
        device = self.slots.device
        self.slots.zero_()
        fn()
        torch.cuda.synchronize(device)
        same = torch.equal(self.slots, self.want)
        ms = min(self.timer(fn, self.reps) for _ in range(3))
        torch.cuda.synchronize(device)
        started = time.perf_counter()
        for _ in range(self.reps):
            fn()
        host_us = (time.perf_counter() - started) * 1e6 / self.reps
        torch.cuda.synchronize(device)
        slows, copy_ms = self.beside(fn, ms, priority)
        rate, rate_beside = self.n_bytes / (ms * 1e-3), self.n_bytes / (copy_ms * 1e-3)
        print(f"  {label:24} {ms:8.3f} ms {rate / 1e9:6.1f} GB/s ({rate / self.pinned_rate:4.0%} of pinned)  host "
              f"{host_us:8.1f} us  slows {slows:.2f}x  beside {rate_beside / 1e9:6.1f} GB/s "
              f"({rate_beside / self.pinned_rate:4.0%})  bytes {'equal' if same else 'DIFFER'}", flush=True)
        return ms


if __name__ == "__main__":
    sys.exit(main())
