"""On the GPU: where a prompt's time goes. One warm `Engine.prefill` of N random tokens timed, then the same
prefill under torch.profiler: GPU kernel time against wall time (the rest is host work or waiting), kernels by
device time, and the host's ops by self time (Python-side costs show there).

Usage: python3 tools/device/profile_prompt.py MODEL.gguf [--tokens N] [--vram-budget GIB] [--rows K] [--stacks]
       [--kv-dtype float16|int8] [--syncs] [--routing balanced] [--timeline]

--stacks adds the device time by input shapes, then one more prefill under a dispatch logger listing each matrix
product and softmax with its shapes, dtypes and call site (the innermost strata frames): the shapes join the two,
and say which line of the model issues a slow torch op. --syncs lists, by call site, the operations of one more prefill
that made the host wait for the GPU (torch's sync debug mode).
"""

import argparse
import collections
import sys
import time
import traceback
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from strata.engine.engine import Engine, EngineConfig  # noqa: E402

import prompt_timeline  # noqa: E402  (this folder)


def streaming(engine, ids) -> None:
    """One more prefill with the streamer's copy batches timed: per routed layer, the host's streaming time (its
    bookkeeping and copy launches), the wait for the routing, the copies' GPU time and GB/s against pinned copies."""
    from strata.bench.ceilings import host_to_device_bandwidth
    from strata.bench.prompt import _streamer

    streamer = _streamer(engine)
    if streamer is None or not hasattr(streamer, "queue"):
        print("streaming: none (all resident, or split across cards)")
        return
    stats = streamer.stats
    before = (stats.layers, stats.host_s, stats.sync_s, stats.bytes_streamed, stats.bytes_late, streamer.queue.launches,
              stats.lend_s, stats.refill_s, stats.refill_bytes)
    streamer.queue.timed = True
    torch.cuda.synchronize()
    started = time.perf_counter()
    engine.prefill(ids)
    torch.cuda.synchronize()
    wall = time.perf_counter() - started
    streamer.queue.timed = False
    copy_ms = streamer.queue.gather_ms()
    layers = stats.layers - before[0]
    moved, late = stats.bytes_streamed - before[3], stats.bytes_late - before[4]
    pinned = host_to_device_bandwidth(torch.device("cuda"))
    rate = moved / (copy_ms * 1e-3) if copy_ms else 0.0
    queue = streamer.queue
    path = ("three copies an expert" if queue.per_part else f"{queue.form} by {queue.copied_by}" if queue.dma
            else f"{queue.form} {queue.config.name()}")
    print(f"streaming ({path}): {layers} routed layers, {(streamer.queue.launches - before[5]) / max(layers, 1):.2f} "
          f"copy batches a layer, {moved / 2**20 / max(layers, 1):.1f} MiB a layer ({late / max(moved, 1):.0%} late); "
          f"host {(stats.host_s - before[1]) * 1e3 / max(layers, 1):.3f} ms a layer, routing read "
          f"{(stats.sync_s - before[2]) * 1e3 / max(layers, 1):.3f} ms a layer; copies' GPU time "
          f"{copy_ms / max(layers, 1):.3f} ms a layer, {rate / 1e9:.1f} GB/s = {rate / pinned:.0%} of the pinned copy "
          f"rate {pinned / 1e9:.1f} GB/s; PCIe floor {moved / pinned * 1e3:.1f} ms of this run's {wall * 1e3:.1f} ms")
    refilled = stats.refill_bytes - before[8]
    print(f"lending: {(stats.lend_s - before[6]) * 1e3:.1f} ms of host at the prompt's start; giving back: "
          f"{(stats.refill_s - before[7]) * 1e3:.1f} ms of host and {refilled / 2**20:.0f} MiB refilled "
          f"({refilled / pinned * 1e3:.1f} ms at the pinned rate, in the run's wall time)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--vram-budget", type=float, default=None)
    parser.add_argument("--rows", type=int, default=30, help="rows of each table")
    parser.add_argument("--stacks", action="store_true", help="also by input shapes and by call site")
    parser.add_argument("--kv-dtype", default="float16", help="KV cache: float16 (the default) or int8 (paged)")
    parser.add_argument("--syncs", action="store_true", help="also list the operations that make the host wait")
    parser.add_argument("--routing", default="model", choices=("model", "balanced"),
                        help="balanced: every chunk's tokens spread over all experts (bench prompt's load test)")
    parser.add_argument("--timeline", action="store_true", help="the copy stream against the compute stream")
    args = parser.parse_args()
    engine = Engine(args.model, EngineConfig(device="cuda", dtype="bfloat16", n_ctx=args.tokens + 64,
                                             vram_budget=args.vram_budget, kv_dtype=args.kv_dtype))
    engine.model.balanced_prompt_routing = args.routing == "balanced"
    vocab = engine.model.config.vocab_size
    ids = torch.randint(0, vocab, (args.tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    engine.prefill(ids)  # compile and warm
    torch.cuda.synchronize()
    started = time.perf_counter()
    engine.prefill(ids)
    torch.cuda.synchronize()
    wall = time.perf_counter() - started
    print(f"prefill {args.tokens} tokens: {wall * 1000:.1f} ms = {args.tokens / wall:.1f} tok/s (no profiler)")
    fresh = torch.randint(0, vocab, (args.tokens,), generator=torch.Generator().manual_seed(1)).tolist()
    streaming(engine, fresh)  # another prompt: nothing of it is cached or checkpointed
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=args.stacks,
                 with_stack=args.stacks) as prof:
        engine.prefill(ids)
        torch.cuda.synchronize()
    if args.timeline:
        prompt_timeline.report(prof)
    table = prof.key_averages()
    kernels = [e for e in table if e.device_type == torch.autograd.DeviceType.CUDA]
    device_ms = sum(e.self_device_time_total for e in kernels) / 1000
    print(f"GPU kernel time {device_ms:.1f} ms ({device_ms / (wall * 1000):.0%} of the unprofiled wall time), "
          f"{sum(e.count for e in kernels)} kernels")
    print(table.table(sort_by="self_cuda_time_total", row_limit=args.rows, max_name_column_width=90))
    print(table.table(sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=70))
    if args.stacks:
        by_shape = prof.key_averages(group_by_input_shape=True)
        print(by_shape.table(sort_by="self_cuda_time_total", row_limit=args.rows, max_name_column_width=40,
                             max_shapes_column_width=90))
        print_call_sites(engine, ids)
    if args.syncs:
        other = torch.randint(0, vocab, (args.tokens,), generator=torch.Generator().manual_seed(2)).tolist()
        print_sync_sites(engine, other)  # a fresh prompt: nothing of it cached


def print_sync_sites(engine, ids) -> None:
    """One more prefill under torch's sync debug mode: each operation that made the host wait for the GPU (a device
    read, a blocking copy, nonzero ...), counted by its call site (the innermost strata frames)."""
    import warnings

    seen = collections.Counter()
    shown = warnings.showwarning

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchronizing" not in str(message):
            return shown(message, category, filename, lineno, file, line)
        frames = [f for f in traceback.extract_stack()[:-1] if "/strata/" in f.filename or "/tools/" in f.filename]
        seen[" < ".join(f"{f.filename.split('strata/')[-1]}:{f.lineno} {f.name}" for f in frames[-3:][::-1])] += 1

    torch.cuda.synchronize()
    warnings.showwarning = record
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = record  # catch_warnings restores the hook it found on entry
            torch.cuda.set_sync_debug_mode("warn")
            try:
                engine.prefill(ids)
            finally:
                torch.cuda.set_sync_debug_mode("default")
    finally:
        warnings.showwarning = shown
    print(f"\nhost waits for the GPU in one prefill of {len(ids)} tokens: {sum(seen.values())} (count, call site)")
    for site, count in seen.most_common():
        print(count, site)


LOGGED_OPS = {"mm", "bmm", "addmm", "baddbmm", "_softmax", "_int_mm", "_scaled_dot_product_flash_attention",
              "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention"}


def print_call_sites(engine, ids) -> None:
    """Each matrix product / softmax of one prefill: count, op, input shapes and dtypes, and its call site."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = collections.Counter()

    class CallSites(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.__name__.split(".")[0]
            if name in LOGGED_OPS:
                frames = [f for f in traceback.extract_stack() if "/strata/" in f.filename]
                site = " < ".join(f"{f.filename.split('strata/')[-1]}:{f.lineno}" for f in frames[-3:][::-1])
                tensors = [a for a in args if isinstance(a, torch.Tensor)]
                seen[(name, str([tuple(t.shape) for t in tensors]), ",".join(str(t.dtype)[6:] for t in tensors),
                      site)] += 1
            return func(*args, **(kwargs or {}))

    with CallSites():
        engine.prefill(ids)
    print("\nmatrix products and softmax of one prefill: count, op, shapes, dtypes, call site")
    for key, count in seen.most_common():
        print(count, *key)


if __name__ == "__main__":
    main()
