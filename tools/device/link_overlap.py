"""On the GPU: does a layer's expert stream overlap the layer's compute? One full-size qwen4exp layer's worth of
Q2_0 experts (512 x 1.32 MiB, 12 % of them already present, so the misses come in runs) copied host -> device three
ways: the gather kernel (kernels/moe/expert_gather.py, SM programs reading pinned memory), the copy engines with one
copy a run of consecutive experts (torch copy_ of contiguous views), and one copy of the whole layer (the link's
best case). Each alone, then beside a loop of bf16 8192^3 products on the compute stream that lasts about as long:
the copy's and the products' own times in the pair (CUDA events on each stream) against their times alone.

    python3 tools/device/link_overlap.py [--experts 512] [--present 0.12] [--products 8]
"""

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from strata.bench.ceilings import host_to_device_bandwidth  # noqa: E402
from strata.bench.expert_gather import _stack  # noqa: E402
from strata.kernels.moe.expert_gather import GatherConfig, gather_experts_triton, gather_pairs  # noqa: E402
from strata.quant.registry import Q2_0_TYPE  # noqa: E402


def timed(streams_fns, device):
    """Launch each (stream, fn) pair at once; return each one's ms (start and end events on its own stream)."""
    torch.cuda.synchronize(device)
    marks = []
    for stream, fn in streams_fns:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            start.record(stream)
            fn()
            end.record(stream)
        marks.append((start, end))
    torch.cuda.synchronize(device)
    return [s.elapsed_time(e) for s, e in marks]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--experts", type=int, default=512)
    p.add_argument("--present", type=float, default=0.12)
    p.add_argument("--products", type=int, default=8)
    args = p.parse_args()
    device = torch.device("cuda")
    stack = _stack(args.experts, 2560, 640, Q2_0_TYPE, pinned=True)
    rng = np.random.default_rng(0)
    missing = np.sort(rng.permutation(args.experts)[: int(args.experts * (1 - args.present))])
    n = len(missing)
    slots = torch.zeros((args.experts, stack.expert_bytes), dtype=torch.uint8, device=device)
    pinned = host_to_device_bandwidth(device)
    n_bytes = n * stack.expert_bytes
    breaks = np.flatnonzero(np.diff(missing) != 1) + 1
    runs = [(int(r[0]), len(r)) for r in np.split(missing, breaks)]
    print(f"{torch.cuda.get_device_name(device)}; pinned copy rate {pinned / 1e9:.1f} GB/s; {n} of {args.experts} "
          f"experts missing ({n_bytes / 2**20:.0f} MiB) in {len(runs)} runs; floor {n_bytes / pinned * 1e3:.2f} ms")
    parts = [stack.gate.raw, stack.up.raw, stack.down.raw]
    widths = [t[0].numel() for t in parts]
    offsets = np.cumsum([0] + widths)
    pairs = gather_pairs(missing, missing).to(device)
    whole_host = torch.empty(n_bytes, dtype=torch.uint8, pin_memory=True)
    whole_dev = torch.empty(n_bytes, dtype=torch.uint8, device=device)

    def gather():
        gather_experts_triton(slots, stack, pairs, GatherConfig())

    def dma_runs():
        # Expert e's part p lands at slot e's offset for p: a strided destination per part, one copy a run a part.
        for first, count in runs:
            for part, lo, width in zip(parts, offsets[:-1], widths):
                slots[first:first + count, lo:lo + width].copy_(
                    part[first:first + count].reshape(count, width), non_blocking=True)

    def dma_whole():
        whole_dev.copy_(whole_host, non_blocking=True)

    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)

    def products():
        for _ in range(args.products):
            a @ a

    compute, side = torch.cuda.Stream(device), torch.cuda.Stream(device, priority=-1)
    for fn in (gather, dma_runs, dma_whole, products):
        timed([(side, fn)], device)  # warm up (compiles, allocator)
    prod_alone = min(timed([(compute, products)], device)[0] for _ in range(3))
    print(f"products alone {prod_alone:.2f} ms")
    for name, fn in (("gather kernel", gather), ("dma, a copy a run a part", dma_runs), ("dma, one copy", dma_whole)):
        alone = min(timed([(side, fn)], device)[0] for _ in range(3))
        best = None
        for _ in range(3):
            c, q = timed([(compute, products), (side, fn)], device)
            best = (c, q) if best is None or max(c, q) < max(best) else best
        c, q = best
        print(f"{name:26} alone {alone:7.2f} ms ({n_bytes / alone / 1e6:5.1f} GB/s, {n_bytes / alone / 1e6 / pinned * 1e9:4.0%}"
              f" of pinned) | beside: copy {q:7.2f} ms ({n_bytes / q / 1e6:5.1f} GB/s), products {c:7.2f} ms "
              f"({c / prod_alone:.2f}x alone); pair {max(c, q):.2f} ms vs sum {alone + prod_alone:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
