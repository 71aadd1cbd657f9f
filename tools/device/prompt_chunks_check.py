"""On the GPU: where an offloaded long prompt's time goes, chunk by chunk (issue 6: the full-size qwen4exp's 32K
prompt at 12 GiB ran 2x slower with the int8 KV cache, 6 chunks of 5,461 tokens in 1,128 borrowed work slots, than
with fp16's 14 chunks of 2,341, while all resident int8 was 1.9x faster).

For each configuration (KV dtype, chunk spec, --prefill-borrow) one Engine at --vram-budget, a warm prompt, then
the timed prompt; per chunk: wall ms and ms per 1K tokens, the streamer's bytes (late share), its host and routing
wait per layer, the work arena's high water and overflow (bytes the allocator served instead), and the caching
allocator's retries (cudaFree + cudaMalloc after a failed allocation: a sync each) and device allocations.
The configurations isolate the cause: int8 with its own chunks and borrowing, int8 without borrowing, int8 in chunks of
4,096 (the 4K prompt's one chunk, fast there), fp16; int8-fp16-chunks (int8 at fp16's chunk size) on request.

With --cprofile NAME that configuration's prompt runs under Python's profiler: the host's time
by function, where a blocking device read shows with its caller (the streamer's own accounts for only ~7 of the
~94 ms a layer took in the slow run).

Usage: python3 tools/device/prompt_chunks_check.py MODEL.gguf [--tokens N] [--vram-budget GIB] [--only NAME ...]
       [--cprofile NAME ...] [--rows K]
"""

import argparse
import cProfile
import gc
import io
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from strata.engine.engine import Engine, EngineConfig  # noqa: E402

CONFIGS = {  # name -> (kv dtype, prefill chunk, borrow)
    "int8": ("int8", "auto", "auto"),
    "int8-no-borrow": ("int8", "auto", "off"),
    "int8-4096": ("int8", "auto:4096", "auto"),  # the 4K prompt's one chunk (fast there), 8 times
    "int8-fp16-chunks": ("int8", "auto:FP16", "auto"),  # FP16: the fp16 engine's chunk size, found first
    "fp16": ("float16", "auto", "auto"),
}


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def allocator() -> tuple[int, int]:
    if not torch.cuda.is_available():
        return 0, 0
    stats = torch.cuda.memory_stats()
    return stats.get("num_alloc_retries", 0), stats.get("num_device_alloc", 0)


def snapshot(streamer) -> dict:
    """The counters a chunk's row differences (the arena's high water and overflow are running totals)."""
    s = streamer.stats if streamer is not None else None
    arena = getattr(streamer, "arena", None)
    retries, allocs = allocator()
    return dict(t=time.perf_counter(), bytes=s.bytes_streamed if s else 0, late=s.bytes_late if s else 0,
                layers=s.layers if s else 0, host=s.host_s if s else 0.0, wait=s.sync_s if s else 0.0,
                high=arena.high_water if arena else 0, over=arena.overflow_bytes if arena else 0,
                retries=retries, allocs=allocs)


def run(model: str, name: str, kv: str, chunk: str, borrow: str, args) -> int:
    from strata.bench.prompt import _streamer

    engine = Engine(model, EngineConfig(device=args.device, dtype="bfloat16", n_ctx=args.tokens + 64,
                                        vram_budget=args.vram_budget, kv_dtype=kv, prefill_chunk=chunk,
                                        prefill_borrow=borrow, checkpoints=0))
    streamer = _streamer(engine)
    print(f"== {name}: kv {kv}, chunks up to {engine.prefill_chunk} tokens ({chunk}), {engine.chunk_plan.work_slots} "
          f"borrowed work slots (borrow {borrow}), streamer {'on' if streamer is not None else 'off'}", flush=True)
    vocab = engine.model.config.vocab_size
    warm = torch.randint(0, vocab, (min(3000, args.tokens),), generator=torch.Generator().manual_seed(1)).tolist()
    engine.prefill(warm)  # compiles; its QSA layers select past 2,051 cells
    ids = torch.randint(0, vocab, (args.tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    marks = []  # (tokens done, snapshot) after each chunk
    engine.on_prefill_progress = lambda progress: marks.append((progress.done, snapshot(streamer)))
    profiler = cProfile.Profile() if name in (args.cprofile or []) else None
    sync()
    marks.append((0, snapshot(streamer)))
    if profiler is not None:
        profiler.enable()
    engine.prefill(ids)
    sync()
    if profiler is not None:
        profiler.disable()
    marks.append((args.tokens, snapshot(streamer)))  # the end: lent slots refilled
    for (done0, a), (done1, b) in zip(marks, marks[1:]):
        n, ms = done1 - done0, (b["t"] - a["t"]) * 1e3
        layers = max(b["layers"] - a["layers"], 1)
        streamed = b["bytes"] - a["bytes"]
        what = f"chunk to {done1:6d} ({n:5d} tokens)" if n else "after the last chunk (refill)"
        print(f"  {what}: {ms:8.1f} ms" + (f" = {ms * 1e3 / n:6.2f} ms/1K" if n else "") +
              f"; streamed {streamed / 2**20:7.1f} MiB ({(b['late'] - a['late']) / max(streamed, 1):4.0%} late); "
              f"host {(b['host'] - a['host']) * 1e3 / layers:.2f} + routing wait "
              f"{(b['wait'] - a['wait']) * 1e3 / layers:.2f} ms a layer; arena high {b['high'] / 2**20:.0f} MiB, "
              f"overflow +{(b['over'] - a['over']) / 2**20:.1f} MiB; allocator retries +{b['retries'] - a['retries']}, "
              f"device allocations +{b['allocs'] - a['allocs']}", flush=True)
    wall = marks[-1][1]["t"] - marks[0][1]["t"]
    print(f"  total {wall * 1e3:.0f} ms = {args.tokens / wall:.1f} tok/s"
          + (" (under cProfile)" if profiler is not None else ""), flush=True)
    if profiler is not None:  # the host's time by function: a blocking call (a device read) shows with its caller
        for key in ("tottime", "cumulative"):
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats(key).print_stats(args.rows)
            print(f"  host functions by {key}:\n" + text.getvalue(), flush=True)
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_callers(8)
        print("  the 8 costliest by own time, with their callers:\n" + text.getvalue(), flush=True)
    size = engine.prefill_chunk
    del engine, streamer
    gc.collect()  # the pinned host experts and device memory back before the next engine loads its own
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return size


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--vram-budget", type=float, default=4.4)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--only", nargs="+", choices=list(CONFIGS), help="these configurations (default: all)")
    parser.add_argument("--cprofile", nargs="+", choices=list(CONFIGS), default=[],
                        help="the timed prompt of these configurations under cProfile")
    parser.add_argument("--rows", type=int, default=25, help="rows of each cProfile table")
    args = parser.parse_args()
    names = args.only or ["fp16", "int8", "int8-no-borrow", "int8-4096"]
    fp16_chunk = None
    for name in sorted(names, key=lambda n: n != "fp16"):  # fp16 first: its chunk size is another's spec
        kv, chunk, borrow = CONFIGS[name]
        if "FP16" in chunk:
            if fp16_chunk is None:
                fp16_chunk = Engine(args.model, EngineConfig(device=args.device, dtype="bfloat16",
                                                             n_ctx=args.tokens + 64, vram_budget=args.vram_budget,
                                                             kv_dtype="float16")).prefill_chunk
            chunk = chunk.replace("FP16", str(fp16_chunk))
        size = run(args.model, name, kv, chunk, borrow, args)
        if name == "fp16":
            fp16_chunk = size


if __name__ == "__main__":
    main()
