"""L2 prefetch from inside a kernel (issue 4, STRATA_L2_PREFETCH): a grid's programs each ask the L2 for a share of
some other tensors' bytes (`prefetch_share`), PTX `prefetch.global.L2::evict_last` a 128-byte line a thread: no
registers filled, nothing waited for, the lines kept past the streamed ones where the cache must choose.

Why: a decode step's routed expert kernels cannot load their weights before the routing is known, so while a
layer's routing runs the HBM is nearly idle; the experts' gate/up programs, launched early under PDL and waiting
for the routing, can meanwhile bring the next layer's q/k/v and o weights (~10.6 MB for A3B, well inside the
H200's 50 MB L2) to the L2, where those matvecs then find them. Under Triton's interpreter (the CPU tests) a
prefetch is a no-op: it changes no result, only where bytes come from.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from strata.kernels import INTERPRETED  # decided before Triton was imported

LINE = tl.constexpr(128)  # bytes an L2 prefetch brings (a cache line)

if INTERPRETED:
    @triton.jit
    def _prefetch_line(at):
        pass
else:
    @triton.jit
    def _prefetch_line(at):
        """Ask the L2 for the line holding byte address `at` (int64), kept before streamed lines (evict_last)."""
        tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1];\n\tmov.u32 $0, 0;", "=r,l", [at],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def share_lines(a, lines_a, b, lines_b, program, PER: tl.constexpr):
    """[PER] int64: the byte addresses of program `program`'s lines among the lines_a lines at a then the lines_b
    at b (uint8 pointers): program p takes lines p * PER .. (the grid's programs times PER cover them:
    `per_program`); past the end, the last line again (a cache hit, no bytes)."""
    g = tl.minimum(program * PER + tl.arange(0, PER), lines_a + lines_b - 1).to(tl.int64)
    return tl.where(g < lines_a, a.to(tl.int64) + g * LINE, b.to(tl.int64) + (g - lines_a) * LINE)


@triton.jit
def prefetch_share(a, lines_a, b, lines_b, program, PER: tl.constexpr):
    """Ask the L2 for program `program`'s share of the lines (`share_lines`)."""
    _prefetch_line(share_lines(a, lines_a, b, lines_b, program, PER))


def regions(tensors) -> tuple:
    """(a, lines_a, b, lines_b) for `prefetch_share` from 1-2 tensors (their whole bytes), or () for none."""
    tensors = [t for t in tensors if t is not None and t.numel()][:2]
    if not tensors:
        return ()
    lines = [-(-t.numel() * t.element_size() // LINE.value) for t in tensors]
    if len(tensors) == 1:
        return tensors[0], lines[0], tensors[0], 0
    return tensors[0], lines[0], tensors[1], lines[1]


def per_program(region: tuple, programs: int) -> int:
    """PER: lines a program prefetches (a power of two) so that `programs` programs cover the region."""
    return triton.next_power_of_2(max(1, -(-(region[1] + region[3]) // programs)))


def uint8(t: torch.Tensor) -> torch.Tensor:
    """t's bytes as a flat uint8 view (the kernels' pointer type for byte addressing)."""
    return t.reshape(-1).view(torch.uint8)
