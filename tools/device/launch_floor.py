"""On the GPU (issue 4): what one kernel of a decode step's chain costs when it does nearly nothing. A chain of
dependent launches in one CUDA graph, each reading what the kernel before it wrote (one int32 after its wait) and
writing it plus one, with and without PDL (mode 1: the next kernel launches at this one's start and waits), at
several grid sizes and warps: microseconds a kernel, the floor of a step of N launches a layer. The chain's last
value is checked against the number of launches.

Usage: python3 tools/device/launch_floor.py [--launches 432] [--grids 1,32,132,528] [--warps 4,8]
"""

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from strata.bench.ceilings import graph_us  # noqa: E402
from strata.kernels.pdl import pdl_start, pdl_wait  # noqa: E402


@triton.jit
def _step_kernel(src, dst, PDL: tl.constexpr):
    """dst[p] = src[0] + 1 for each program p: a read of the predecessor's output after the wait, then a store."""
    pdl_start(PDL)
    pdl_wait(PDL)
    tl.store(dst + tl.program_id(0), tl.load(src) + 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--launches", type=int, default=432, help="a chain's kernels (A3B: 48 layers x 9)")
    ap.add_argument("--grids", default="1,32,132,528")
    ap.add_argument("--warps", default="4,8")
    args = ap.parse_args()
    grids = [int(g) for g in args.grids.split(",")]
    bufs = [torch.zeros(max(grids), dtype=torch.int32, device="cuda") for _ in range(2)]
    print(f"{torch.cuda.get_device_name()}: a chain of {args.launches} dependent launches in one CUDA graph")
    for warps in [int(w) for w in args.warps.split(",")]:
        for grid in grids:
            line = f"  {grid:4d} programs x {warps} warps:"
            for pdl in (0, 1):
                def step(i: int, grid=grid, pdl=pdl) -> None:
                    _step_kernel[(grid,)](bufs[i % 2], bufs[(i + 1) % 2], PDL=pdl, num_warps=warps,
                                          **({"launch_pdl": True} if pdl else {}))
                bufs[0].zero_()
                us = graph_us(step, [(i,) for i in range(args.launches)], "cuda")
                bufs[0].zero_()
                bufs[1].zero_()
                for i in range(args.launches):
                    step(i)
                torch.cuda.synchronize()
                ok = int(bufs[args.launches % 2][0]) == args.launches
                line += f" {'PDL' if pdl else 'plain'} {us:5.2f} us a kernel ({'OK' if ok else 'WRONG'})"
            print(line, flush=True)


if __name__ == "__main__":
    main()
