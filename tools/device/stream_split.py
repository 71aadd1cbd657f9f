"""On the GPU: a streamed prompt's time split into its copies and its compute (issue 6 end to end). The same engine
and prompt run four ways, each timed (median of --reps) after a warm run:
  streamed      as the engine runs it (the copy stream's batches beside the compute stream);
  compute only  the same launches with every expert copy skipped (the ring's slots keep stale bytes: the logits are
                wrong, the work and its order are the same), so its time is the compute's alone;
each with the next layer's copy queued after the launch (STRATA_PF_EARLY=0) and early (the default). Then one
profiled prefill of "streamed" and of "compute only": each compute kernel's device time in both, so a kernel that
the copies slow shows beside its time alone. If streamed takes about copies + compute, they serialise; if about
max(copies, compute), they overlap and the larger is the floor to move. --dump: the waits and a window of events of
one more profiled prefill (prompt_timeline.waits, dump).

Usage: python3 tools/device/stream_split.py MODEL.gguf [--tokens 4096] [--vram-budget 7] [--reps 3]
"""

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from strata import switches  # noqa: E402
from strata.engine.copy_queue import CopyQueue  # noqa: E402
from strata.engine.engine import Engine, EngineConfig  # noqa: E402

import prompt_timeline  # noqa: E402  (this folder)

_launch, _copy_runs = CopyQueue.launch, CopyQueue.copy_runs


def copies(on: bool) -> None:
    CopyQueue.launch = _launch if on else (lambda self, *a: None)
    CopyQueue.copy_runs = _copy_runs if on else (lambda self, *a: None)


def reset(streamer) -> None:
    """The streamer built again under the switches now set (STRATA_PF_EARLY is read when it is made), its lent slots
    given back first and the engine's chunk rule's work slots kept."""
    streamer.return_slots()
    work = streamer.work_slots
    streamer.__init__(streamer.host_stacks, streamer.cache, streamer.device, streamer.min_tokens)
    streamer.work_slots = work


def timed(engine, ids, reps) -> float:
    engine.prefill(ids)  # warm (and compiles for this form)
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        engine.prefill(ids)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1e3


def kernels(engine, ids) -> dict:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        engine.prefill(ids)
        torch.cuda.synchronize()
    return {e.key: (e.self_device_time_total / 1e3, e.count) for e in prof.key_averages()
            if e.device_type == torch.autograd.DeviceType.CUDA}


def compare(engine, streamer, ids, rows: int) -> None:
    """Each compute kernel's device time in one profiled prefill with the copies and one without."""
    copies(True)
    reset(streamer)
    with_copies = kernels(engine, ids)
    copies(False)
    alone = kernels(engine, ids)
    copies(True)
    print("\nkernels, device ms: streamed | compute only | ratio (count)  [queued early]")
    for name, (ms, count) in sorted(with_copies.items(), key=lambda kv: -kv[1][0])[:rows]:
        b = alone.get(name, (0.0, 0))[0]
        print(f"  {ms:9.2f} | {b:9.2f} | {ms / b if b else float('nan'):5.2f}x ({count})  {name[:90]}")
    total_a, total_b = (sum(ms for ms, _ in k.values()) for k in (with_copies, alone))
    print(f"  all kernels: {total_a:.1f} | {total_b:.1f} ms")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--vram-budget", type=float, default=7.0)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--rows", type=int, default=22)
    p.add_argument("--dump", default="", choices=("", "early", "late"),
                   help="then one profiled streamed prefill with the next layer queued early (the default) or after "
                        "the launch (STRATA_PF_EARLY=0): its waits, and its events in a window in time order")
    args = p.parse_args()
    engine = Engine(args.model, EngineConfig(device="cuda", dtype="bfloat16", n_ctx=args.tokens + 64,
                                             vram_budget=args.vram_budget))
    engine.model.balanced_prompt_routing = True
    ids = torch.randint(0, engine.model.config.vocab_size, (args.tokens,),
                        generator=torch.Generator().manual_seed(0)).tolist()
    from strata.bench.prompt import _streamer

    streamer = _streamer(engine)
    from strata.bench.ceilings import host_to_device_bandwidth

    pinned = host_to_device_bandwidth(torch.device("cuda"))
    print(f"{args.tokens} tokens at {args.vram_budget} GiB, chunks of {engine.prefill_chunk}, ring "
          f"{getattr(streamer, 'ring_slots', 0)} slots, {getattr(streamer, 'experts_per_layer', 0)} experts a layer")
    for early in (False, True) if args.reps else ():
        with switches.override(STRATA_PF_EARLY=early):
            reset(streamer)
            for on in (True, False):
                copies(on)
                moved = streamer.stats.bytes_streamed
                ms = timed(engine, ids, args.reps)
                per = (streamer.stats.bytes_streamed - moved) / (args.reps + 1)
                print(f"{'early' if early else 'late':8s} {'streamed' if on else 'compute only':13s} "
                      f"{ms:8.1f} ms  ({per / 1e9:.2f} GB a prompt asked to stream; "
                      f"{per / pinned * 1e3:.1f} ms at the pinned rate, {pinned / 1e9:.1f} GB/s)")
    if args.reps and args.rows:
        compare(engine, streamer, ids, args.rows)
    if args.dump:
        with switches.override(STRATA_PF_EARLY=args.dump == "early"):
            reset(streamer)
            engine.prefill(ids)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                engine.prefill(ids)
                torch.cuda.synchronize()
        trace = prompt_timeline.trace_of(prof)
        prompt_timeline.waits(trace)
        prompt_timeline.dump(trace)


if __name__ == "__main__":
    main()
