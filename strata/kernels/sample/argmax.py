"""A greedy token in one launch: the index of the first largest float32 logit, as `torch.argmax` gives it (NaN the
largest, -0.0 equal to 0.0), where torch's reduction took ~8 us of an A3B decode step's critical path on an H200.

Each program takes CHUNK logits in order and writes its largest key and the first index holding it; the last to
arrive (a per-device counter, `decode_short.arrival_counters`: every launch leaves it zero for the next) reduces the
programs' pairs the same way, so the first maximum of the first chunk holding it wins. The keys are the logits'
`route_topk.ordered_key`s (int32 that order as the floats do), NaN above +inf, -0.0 read as 0.0.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from strata.kernels.pointwise.route_topk import first_max, ordered_key

CHUNK = 4096  # logits a program: ~37 programs for a 151,936-token vocabulary
COUNTER = 0  # the arrival counter this launch counts on (no other kernel of a step counts while it runs)


@triton.jit
def _argmax_kernel(x_ptr, n, keys_ptr, firsts_ptr, count_ptr, out_ptr, PROGRAMS: tl.constexpr, CHUNK: tl.constexpr,
                   PB: tl.constexpr):
    p = tl.program_id(0)
    i = p * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(x_ptr + i, mask=i < n, other=float("-inf"))
    bits = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)  # -0.0 as 0.0
    key = tl.where(x != x, 0x7FFFFFFF, ordered_key(bits))  # NaN above +inf's 0x7F800000
    best, first = first_max(key, i, 2147483647)
    tl.store(keys_ptr + p, best)
    tl.store(firsts_ptr + p, first)
    tl.debug_barrier()  # the pair is written before the program counts itself (release)
    if tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu") == PROGRAMS - 1:
        q = tl.arange(0, PB)
        keys = tl.load(keys_ptr + q, mask=q < PROGRAMS, other=-2147483648, cache_modifier=".cg")
        firsts = tl.load(firsts_ptr + q, mask=q < PROGRAMS, other=2147483647, cache_modifier=".cg")
        _, first = first_max(keys, firsts, 2147483647)  # the first index of the largest key over the chunks
        tl.store(out_ptr, first.to(tl.int64))
        tl.store(count_ptr, 0)  # ready for the next launch (a graph's next replay)


def argmax_triton(logits: torch.Tensor) -> torch.Tensor | None:
    """float32 logits (any shape, read flat) -> a one-element long tensor on their device: the index of the first
    largest, or None where the launch cannot count its programs (the arrival counters not yet made while capturing,
    or more than 2^31 logits): the caller takes torch.argmax then."""
    from strata.kernels.attention.decode_short import arrival_counters

    flat = logits.reshape(-1)
    counters = arrival_counters(flat.device, COUNTER + 1)
    if counters is None or flat.dtype != torch.float32 or not 0 < flat.numel() < 2**31:
        return None
    programs = triton.cdiv(flat.numel(), CHUNK)
    pairs = torch.empty(2, programs, dtype=torch.int32, device=flat.device)
    out = torch.empty(1, dtype=torch.long, device=flat.device)
    _argmax_kernel[(programs,)](flat, flat.numel(), pairs[0], pairs[1], counters[COUNTER:], out, PROGRAMS=programs,
                                CHUNK=CHUNK, PB=triton.next_power_of_2(programs), num_warps=4)
    return out
