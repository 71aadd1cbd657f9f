"""On the GPU: where a multi-chunk streamed prompt loses time, chunk by chunk, for each STRATA_PF_STREAM form.

Session 11's first call: the full-size qwen4exp at 12 GiB read a 4K prompt (one chunk) at 1.69x the PCIe floor by
the copy engines but a 32K one (six chunks) at 4.75x; by the gather kernel 1.63x both. This prints, for each form,
each chunk's time (the engine's progress hook, host time: the host syncs on each layer's routing, so it tracks the
device within a layer) with the streamer's host split a layer (its own work, its routing wait, the rest), the time
the forwards waited for the n-gram rows and the time in Python's collector a chunk, then (--profile) one
profiled prompt of two chunks by the first form: every host-to-device copy the device ran, grouped by kind (pinned or
pageable source) with its bytes and rate; the host's slowest runtime calls (a copy call that returns late is a copy
the runtime made synchronous); and the compute stream's longest waits (prompt_timeline.waits).

Usage: python3 tools/device/chunk_probe.py MODEL.gguf [--tokens 32768] [--vram-budget 12]
       [--forms dma,gather,gather@p33] [--before 4096x3] [--profile] [--per-layer]
(--per-layer: each routed layer's host time in the first chunk of each prompt, in order: a slow start is the n-gram
rows or the first copies, a slow middle is not.)
"""

import argparse
import collections
import gc
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from strata import switches  # noqa: E402
from strata.bench.prompt import _streamer  # noqa: E402
from strata.engine.copy_queue import CopyQueue  # noqa: E402
from strata.engine.engine import Engine, EngineConfig  # noqa: E402

import prompt_timeline  # noqa: E402  (this folder)
from stream_split import reset  # noqa: E402  (this folder)


_copy_runs = CopyQueue.copy_runs
IN_COPIES = [0.0]  # host seconds spent queueing the copy engines' calls (a call returns late when the queue is full)


def _timed_copy_runs(self, *args):
    started = time.perf_counter()
    _copy_runs(self, *args)
    IN_COPIES[0] += time.perf_counter() - started


CopyQueue.copy_runs = _timed_copy_runs
PER_LAYER = [False]
LAYER_MARKS: list[float] = []  # host time as each routed layer's streamer run returns (--per-layer)


def time_layers(streamer) -> None:
    """Record the host time each routed layer's run returns (the layer's experts launched after its routing read)."""
    run = streamer.run

    def timed(*args, **kwargs):
        out = run(*args, **kwargs)
        LAYER_MARKS.append(time.perf_counter())
        return out

    streamer.run = timed


def print_layers(start: float, n_layers: int) -> None:
    """The first chunk's layers, ms each (the first from the prompt's start), ten a line."""
    marks = [start] + LAYER_MARKS[:n_layers]
    ms = [f"{(b - a) * 1e3:5.1f}" for a, b in zip(marks, marks[1:])]
    for i in range(0, len(ms), 10):
        print(f"    layers {i:2d}-{min(i + 9, len(ms) - 1):2d}: {' '.join(ms[i:i + 10])}")


IN_GC = [0.0, None]  # host seconds in Python's collector, the current collection's start


def _collector(phase, _info):
    if phase == "start":
        IN_GC[1] = time.perf_counter()
    elif IN_GC[1] is not None:
        IN_GC[0] += time.perf_counter() - IN_GC[1]


gc.callbacks.append(_collector)  # the 82 ms the compute stream sat idle at a chunk boundary: a collection?


def ring_runs(streamer) -> str:
    """How many runs of adjacent slots the ring was lent (1: the copy engines' runs can be long)."""
    ring = streamer.ring
    if ring is None:
        return "no ring"
    return f"ring in {1 + int((np.diff(ring.indices) != 1).sum())} runs of slots"


def chunked(engine, streamer, ids) -> None:
    """One prompt, each chunk's time and the streamer's host split a layer over it."""
    marks = []
    ngram = getattr(engine.model, "ngram_prefetch", None)

    def mark(_=None):
        s = streamer.stats
        marks.append((time.perf_counter(), s.host_s, s.sync_s, s.layers, streamer.copy_calls, IN_COPIES[0],
                      ngram.waited_s if ngram is not None else 0.0, IN_GC[0]))
        if streamer.ring is not None and len(marks) == 2:
            print(f"  {ring_runs(streamer)}")

    engine.on_prefill_progress = mark
    engine.cached_tokens = []
    torch.cuda.synchronize()
    mark()
    LAYER_MARKS.clear()
    engine.prefill(ids)
    torch.cuda.synchronize()
    total = time.perf_counter() - marks[0][0]
    engine.on_prefill_progress = None
    for i, (a, b) in enumerate(zip(marks, marks[1:])):
        layers = max(b[3] - a[3], 1)
        ms = (b[0] - a[0]) * 1e3
        host, sync = (b[1] - a[1]) * 1e3 / layers, (b[2] - a[2]) * 1e3 / layers
        calls, queued = (b[4] - a[4]) / layers, (b[5] - a[5]) * 1e3 / layers
        print(f"  chunk {i}: {ms:8.1f} ms; a layer {ms / layers:6.2f} ms: streamer host {host:5.2f} (of it queueing "
              f"{calls:.0f} copy calls {queued:5.2f}), routing wait {sync:5.2f}, the rest "
              f"{ms / layers - host - sync:6.2f}; n-gram rows waited {(b[6] - a[6]) * 1e3:.1f} ms, Python's "
              f"collector {(b[7] - a[7]) * 1e3:.1f} ms")
    print(f"  all: {total * 1e3:.1f} ms for {len(ids)} tokens")
    if PER_LAYER[0]:
        print_layers(marks[0][0], len(engine.model.expert_stacks))


def bench_like(engine, streamer, spec: str) -> None:
    """What `bench prompt` does before its 32K prompt: the ceilings, then prompts of N tokens R times ("NxR")."""
    from strata.bench.ceilings import host_to_device_bandwidth, read_bandwidth
    from strata.bench.moe_prefill import int8_rate

    device = engine.device
    int8_rate(device), read_bandwidth(device, 1 << 30), host_to_device_bandwidth(device)
    n, reps = (int(v) for v in spec.split("x"))
    vocab = engine.model.config.vocab_size
    for rep in range(reps):
        ids = torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(n + rep)).tolist()
        rings = []
        engine.on_prefill_progress = lambda _: rings.append(ring_runs(streamer))
        engine.cached_tokens = []
        torch.cuda.synchronize()
        started = time.perf_counter()
        engine.prefill(ids)
        torch.cuda.synchronize()
        engine.on_prefill_progress = None
        print(f"  before: {n} tokens {(time.perf_counter() - started) * 1e3:.1f} ms; {rings[:1]}")


def copies_of(trace: dict) -> None:
    """The device's host-to-device copies by kind, and the host's slowest runtime calls."""
    device, host = prompt_timeline._events(trace)
    kinds = collections.defaultdict(lambda: [0, 0.0, 0])
    for e in device:
        if e.get("cat") == "gpu_memcpy":
            k = kinds[e["name"]]
            k[0] += 1
            k[1] += e["dur"] / 1e3
            k[2] += int(e["args"].get("bytes", 0))
    print("\ndevice copies (count, device ms, GB, GB/s while copying):")
    for name, (n, ms, nbytes) in sorted(kinds.items(), key=lambda kv: -kv[1][1]):
        print(f"    {n:6d} {ms:9.2f} {nbytes / 1e9:8.3f} {nbytes / 1e6 / max(ms, 1e-9):8.1f}  {name[:70]}")
    calls = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for h in host:
        c = calls[h["name"]]
        c[0] += 1
        c[1] += h["dur"] / 1e3
        c[2] = max(c[2], h["dur"] / 1e3)
    print("\nhost runtime calls by total time (count, host ms, longest ms):")
    for name, (n, ms, longest) in sorted(calls.items(), key=lambda kv: -kv[1][1])[:12]:
        print(f"    {n:6d} {ms:9.2f} {longest:8.3f}  {name[:70]}")


def form_switches(form: str) -> dict:
    """The switches of a --forms entry: "gather@p33" is the gather kernel on 33 programs (STRATA_PF_GATHER)."""
    stream, _, config = form.partition("@")
    return {"STRATA_PF_STREAM": stream, "STRATA_PF_GATHER": config}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--vram-budget", type=float, default=12.0)
    p.add_argument("--forms", default="dma,gather")
    p.add_argument("--profile", action="store_true", help="then two chunks profiled by the first form")
    p.add_argument("--before", default="", help="NxR: bench prompt's ceilings and R prompts of N tokens first")
    p.add_argument("--per-layer", action="store_true", help="each routed layer's host time in a prompt's first chunk")
    p.add_argument("--seed", type=int, default=0, help="the prompt's ids (bench prompt's are seeded by their length)")
    args = p.parse_args()
    PER_LAYER[0] = args.per_layer
    engine = Engine(args.model, EngineConfig(device="cuda", dtype="bfloat16", n_ctx=args.tokens + 64,
                                             vram_budget=args.vram_budget))
    engine.model.balanced_prompt_routing = True
    streamer = _streamer(engine)
    time_layers(streamer)
    vocab = engine.model.config.vocab_size
    ids = torch.randint(0, vocab, (args.tokens,), generator=torch.Generator().manual_seed(args.seed)).tolist()
    warm = torch.randint(0, vocab, (args.tokens,), generator=torch.Generator().manual_seed(args.seed + 999)).tolist()
    chunk = engine.prefill_chunk
    print(f"{args.tokens} tokens at {args.vram_budget} GiB, chunks of {chunk}, ring {streamer.ring_slots} slots, "
          f"work slots {streamer.work_slots}, early {streamer.early}")
    forms = args.forms.split(",")
    for form in forms:
        with switches.override(**form_switches(form)):
            reset(streamer)
            engine.cached_tokens = []
            engine.prefill(warm[: min(chunk, len(ids))])  # compiles; other ids: the prompt's n-gram rows stay cold
            print(f"\nSTRATA_PF_STREAM={form} (early {streamer.early}):")
            if args.before:
                bench_like(engine, streamer, args.before)
            chunked(engine, streamer, ids)
            print("  again, the first chunk's worth alone:")
            chunked(engine, streamer, ids[:chunk])
    if not args.profile:
        return
    with switches.override(**form_switches(forms[0])):
        reset(streamer)
        two = ids[: 2 * chunk]
        engine.cached_tokens = []
        engine.prefill(two)
        engine.cached_tokens = []
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            engine.prefill(two)
            torch.cuda.synchronize()
    print(f"\nprofiled: {len(two)} tokens by {forms[0]}")
    trace = prompt_timeline.trace_of(prof)
    copies_of(trace)
    prompt_timeline.waits(trace)


if __name__ == "__main__":
    main()
