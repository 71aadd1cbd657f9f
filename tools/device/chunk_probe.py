"""On the GPU: where a multi-chunk streamed prompt loses time, chunk by chunk, for each STRATA_PF_STREAM form.

Session 11's first call: the full-size qwen4exp at 12 GiB read a 4K prompt (one chunk) at 1.69x the PCIe floor by
the copy engines but a 32K one (six chunks) at 4.75x; by the gather kernel 1.63x both. This prints, for each form,
each chunk's time (the engine's progress hook, host time: the host syncs on each layer's routing, so it tracks the
device within a layer) with the streamer's host split a layer (its own work, its routing wait, the rest), then one
profiled prompt of two chunks by the first form: every host-to-device copy the device ran, grouped by kind (pinned or
pageable source) with its bytes and rate; the host's slowest runtime calls (a copy call that returns late is a copy
the runtime made synchronous); and the compute stream's longest waits (prompt_timeline.waits).

Usage: python3 tools/device/chunk_probe.py MODEL.gguf [--tokens 32768] [--vram-budget 12] [--forms dma,gather]
"""

import argparse
import collections
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from strata import switches  # noqa: E402
from strata.bench.prompt import _streamer  # noqa: E402
from strata.engine.engine import Engine, EngineConfig  # noqa: E402

import prompt_timeline  # noqa: E402  (this folder)
from stream_split import reset  # noqa: E402  (this folder)


def chunked(engine, streamer, ids) -> None:
    """One prompt, each chunk's time and the streamer's host split a layer over it."""
    marks = []
    engine.on_prefill_progress = lambda progress: marks.append((time.perf_counter(), streamer.stats.host_s,
                                                                streamer.stats.sync_s, streamer.stats.layers))
    engine.cached_tokens = []
    torch.cuda.synchronize()
    marks.append((time.perf_counter(), streamer.stats.host_s, streamer.stats.sync_s, streamer.stats.layers))
    engine.prefill(ids)
    torch.cuda.synchronize()
    total = time.perf_counter() - marks[0][0]
    engine.on_prefill_progress = None
    for i, (a, b) in enumerate(zip(marks, marks[1:])):
        layers = max(b[3] - a[3], 1)
        ms = (b[0] - a[0]) * 1e3
        host, sync = (b[1] - a[1]) * 1e3 / layers, (b[2] - a[2]) * 1e3 / layers
        print(f"  chunk {i}: {ms:8.1f} ms; a layer {ms / layers:6.2f} ms: streamer host {host:5.2f}, routing wait "
              f"{sync:5.2f}, the rest {ms / layers - host - sync:6.2f}")
    print(f"  all: {total * 1e3:.1f} ms for {len(ids)} tokens")


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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--vram-budget", type=float, default=12.0)
    p.add_argument("--forms", default="dma,gather")
    p.add_argument("--no-profile", action="store_true")
    args = p.parse_args()
    engine = Engine(args.model, EngineConfig(device="cuda", dtype="bfloat16", n_ctx=args.tokens + 64,
                                             vram_budget=args.vram_budget))
    engine.model.balanced_prompt_routing = True
    streamer = _streamer(engine)
    vocab = engine.model.config.vocab_size
    ids = torch.randint(0, vocab, (args.tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    chunk = engine.prefill_chunk
    print(f"{args.tokens} tokens at {args.vram_budget} GiB, chunks of {chunk}, ring {streamer.ring_slots} slots, "
          f"work slots {streamer.work_slots}, early {streamer.early}")
    forms = args.forms.split(",")
    for form in forms:
        with switches.override(STRATA_PF_STREAM=form):
            reset(streamer)
            engine.cached_tokens = []
            engine.prefill(ids[: min(chunk, len(ids))])  # warm: compiles for this form
            print(f"\nSTRATA_PF_STREAM={form} (early {streamer.early}):")
            chunked(engine, streamer, ids)
            print(f"  again, the first chunk's worth alone:")
            chunked(engine, streamer, ids[:chunk])
    if args.no_profile:
        return
    with switches.override(STRATA_PF_STREAM=forms[0]):
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
