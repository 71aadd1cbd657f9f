"""On the GPU: where a prompt's time goes. One warm `Engine.prefill` of N random tokens timed, then the same
prefill under torch.profiler: GPU kernel time against wall time (the rest is host work or waiting), kernels by
device time, and the host's ops by self time (Python-side costs show there).

Usage: python3 tools/device/profile_prompt.py MODEL.gguf [--tokens N] [--vram-budget GIB] [--rows K]
"""

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from strata.engine.engine import Engine, EngineConfig  # noqa: E402


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
    before = (stats.layers, stats.host_s, stats.sync_s, stats.bytes_streamed, stats.bytes_late, streamer.queue.launches)
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
    path = "three copies an expert" if streamer.queue.per_part else f"gather {streamer.queue.config.name()}"
    print(f"streaming ({path}): {layers} routed layers, {(streamer.queue.launches - before[5]) / max(layers, 1):.2f} "
          f"copy batches a layer, {moved / 2**20 / max(layers, 1):.1f} MiB a layer ({late / max(moved, 1):.0%} late); "
          f"host {(stats.host_s - before[1]) * 1e3 / max(layers, 1):.3f} ms a layer, routing read "
          f"{(stats.sync_s - before[2]) * 1e3 / max(layers, 1):.3f} ms a layer; copies' GPU time "
          f"{copy_ms / max(layers, 1):.3f} ms a layer, {rate / 1e9:.1f} GB/s = {rate / pinned:.0%} of the pinned copy "
          f"rate {pinned / 1e9:.1f} GB/s; PCIe floor {moved / pinned * 1e3:.1f} ms of this run's {wall * 1e3:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--vram-budget", type=float, default=None)
    parser.add_argument("--rows", type=int, default=30, help="rows of each table")
    args = parser.parse_args()
    engine = Engine(args.model, EngineConfig(device="cuda", dtype="bfloat16", n_ctx=args.tokens + 64,
                                             vram_budget=args.vram_budget))
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
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        engine.prefill(ids)
        torch.cuda.synchronize()
    table = prof.key_averages()
    kernels = [e for e in table if e.device_type == torch.autograd.DeviceType.CUDA]
    device_ms = sum(e.self_device_time_total for e in kernels) / 1000
    print(f"GPU kernel time {device_ms:.1f} ms ({device_ms / (wall * 1000):.0%} of the unprofiled wall time), "
          f"{sum(e.count for e in kernels)} kernels")
    print(table.table(sort_by="self_cuda_time_total", row_limit=args.rows, max_name_column_width=90))
    print(table.table(sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=70))


if __name__ == "__main__":
    main()
