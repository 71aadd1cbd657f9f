"""Whole CPU pool calls as decode makes them (`strata bench cpu-experts --calls`): where a call's time goes.

For each format and thread count, calls of 1, 3 and 10 missed experts for one token go through the pool exactly as
`CachedExperts.plan_step` hands them over (submit with the routing ids, wait for the result), cycling over copies of
the layer spanning `--footprint-mb` so the weights come from DRAM. Beside each: the bytes' floor (expert bytes / the
host read rate measured with the same threads) and the parts of the fixed cost, each timed on its own:

- hand-off: a no-op through the pool's worker thread and back (submit, wake, result, wake);
- prep: compute() minus its native call (numpy views of the inputs, the output array, Python);
- dispatch: the native call with no experts (numba's argument checks, no parallel region);
- regions: two empty parallel regions on the pool's threads (what waking them for gate/up and for down costs);
- native: the native call itself with its experts (the kernels, the codes, the weighted sum).

Medians of `--reps` x the copies, in microseconds; GB/s = expert bytes / whole call.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch
from numba import njit, prange

from strata.engine.cpu_kernels.layer_call import layer_experts
from strata.engine.cpu_pool import DEFAULT_SPIN_US, CPUExpertPool, worker_setup

CALL_EXPERTS = (1, 3, 10)
TOP_K = 8
# (gate, up, down) formats of the A3B shape's calls; IQ2_XS has no SIMD kernel (the pool's torch fallback)
CALL_FORMATS = [("Q4_0",) * 3, ("Q4_K", "Q4_K", "Q6_K"), ("Q2_0",) * 3, ("Q8_0",) * 3, ("IQ2_XS",) * 3]


@njit(parallel=True, nogil=True, cache=True)
def _empty_region(flags):
    """One parallel region with no work to speak of: a write per thread's item."""
    for i in prange(flags.shape[0]):
        flags[i] = i


def _median_us(fn, n: int, gap_us: float = 0.0) -> float:
    """Median time of fn(i), i = 0..n-1; `gap_us` of busy waiting before each (untimed): the decode thread's
    GPU work between two layers that miss experts, during which the pool's threads spin or fall asleep."""
    times = []
    for i in range(n):
        resume = time.perf_counter() + gap_us * 1e-6
        while time.perf_counter() < resume:
            pass
        start = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def _routing(experts: list[int], rng) -> tuple[torch.Tensor, torch.Tensor]:
    """One token's ids [1, k] holding `experts` (the rest other experts) and softmax-like weights [1, k]; k is 8,
    or more for the 10-expert call (a whole token's misses at once: the kernels take any k)."""
    ids = list(experts) + [10_000 + i for i in range(TOP_K - len(experts))]  # ids no call asks for
    weights = rng.random(len(ids)).astype(np.float32)
    return torch.tensor([ids]), torch.from_numpy(weights / weights.sum())[None]


def _on_worker(pool: CPUExpertPool, fn):
    return pool.worker.submit(fn).result()


def call_rows(pool: CPUExpertPool, stack, max_calls: int, reps: int, read_gbs: float, rng,
              gap_us: float = 0.0) -> list[str]:
    """Table rows for one pool (its format, its threads): calls of 1, 3, 10 experts, each cycling over at most
    `max_calls` different sets of experts (every expert of the stack once, where it allows)."""
    embd = stack.gate.shape[-1]
    x = torch.randn(1, embd, generator=torch.Generator().manual_seed(0))
    host = pool.host[0]
    flags = np.zeros(pool.threads, np.int64)
    handoff = _median_us(lambda i: _on_worker(pool, int), 50 * reps)
    regions = _on_worker(pool, lambda: _median_us(lambda i: (_empty_region(flags), _empty_region(flags)), 50 * reps))
    rows = []
    for k in CALL_EXPERTS:
        sets = [list(range(c * k, (c + 1) * k)) for c in range(stack.gate.shape[0] // k)][:max_calls]
        routings = [_routing(experts, rng) for experts in sets]
        n, bytes_ = len(sets) * reps, k * stack.expert_bytes

        def call(i):
            ids, weights = routings[i % len(sets)]
            pool.submit(0, x, None, weights, sets[i % len(sets)], ids=ids).result()

        for i in range(len(sets)):  # compiles (or loads numba's cache), warms the buffers
            call(i)
        whole = _median_us(call, n, gap_us)
        native = prep = dispatch = float("nan")
        if host.simd:
            buffers = pool._buffers(host)
            x_np, out = x.numpy(), np.empty((1, embd), np.float32)
            arrays = [(ids.numpy(), w.numpy(), np.asarray(e, np.int64)) for (ids, w), e in zip(routings, sets)]

            def native_call(i):
                ids, weights, experts = arrays[i % len(sets)]
                buffers.run(host.views, x_np, ids, weights, experts, out)

            def no_experts(i):
                ids, weights, _ = arrays[i % len(sets)]
                buffers.run(host.views, x_np, ids, weights, np.zeros(0, np.int64), out)

            def compute(i):
                ids, weights = routings[i % len(sets)]
                pool.compute(0, x, None, weights, sets[i % len(sets)], ids=ids)

            native = _on_worker(pool, lambda: _median_us(native_call, n))
            dispatch = _on_worker(pool, lambda: _median_us(no_experts, n))
            prep = max(_on_worker(pool, lambda: _median_us(compute, n)) - native, 0.0)
        floor = bytes_ / (read_gbs * 1e3)
        rows.append(f"| {'/'.join(stack_types(stack))} | {pool.threads} | {pool.spin_us:.0f} | {k} | {bytes_ / 1e6:.2f} | {floor:.0f} | "
                    f"{whole:.0f} | {whole / floor:.1f}x | {bytes_ / whole / 1e3:.2f} | {handoff:.0f} | {prep:.0f} | "
                    f"{dispatch:.0f} | {regions:.0f} | {native:.0f} |")
    return rows


def stack_types(stack) -> tuple[str, ...]:
    from strata.quant import get_format

    return tuple(get_format(m.ggml_type).name for m in (stack.gate, stack.up, stack.down))


def calls_table(args, make_stack, read_rate) -> int:
    """Print the calls table for the A3B shape (2048 x 768); threads from `--calls-threads` (e.g. 1,2)."""
    from strata.engine.cpu_pool import pool_threads

    threads_list = [pool_threads(int(t)) for t in args.calls_threads.split(",")] if args.calls_threads else \
        [pool_threads(args.threads)]
    spins = [float(s) for s in args.calls_spin.split(",")] if args.calls_spin else [DEFAULT_SPIN_US]
    only = {f.strip().upper() for f in args.formats.split(",") if f.strip()}
    embd, ff = 2048, 768
    print(f"CPU pool calls, A3B shape {embd}x{ff}, one token, top-{TOP_K}; weights cycle over {args.footprint_mb} MB; "
          f"{args.calls_gap_us:.0f} us of busy waiting before each call; microseconds (medians); floor = expert bytes "
          "/ the read rate with the same threads")
    print("| gate/up/down | threads | spin us | experts | MB | floor us | call us | of floor | GB/s | hand-off us | prep us | "
          "dispatch us | 2 regions us | native us |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rng = np.random.default_rng(0)
    for types in CALL_FORMATS:
        if only and types[0] not in only:
            continue
        one = make_stack(types, 1, embd, ff, rng)
        per_layer = max(CALL_EXPERTS) * one.expert_bytes
        copies = max(1, -(-args.footprint_mb * (1 << 20) // per_layer))
        stack = make_stack(types, max(CALL_EXPERTS), embd, ff, rng, copies)
        for threads in threads_list:
            worker_setup(threads)
            read = read_rate([m.raw.numpy() for m in (stack.gate, stack.up, stack.down)], 3) / 1e9
            for spin in spins:
                pool = CPUExpertPool({0: stack}, threads, spin)
                try:
                    slow = not pool.host[0].simd  # the torch fallback: a few calls, one pass
                    for row in call_rows(pool, stack, 4 if slow else 10**9, 1 if slow else args.reps, read, rng,
                                         args.calls_gap_us):
                        print(row, flush=True)
                finally:
                    pool.close()
    return 0
