"""`strata bench prompt`: prompt tokens/s at each context length, beside the floor of the placement.

Experts offloaded and streamed: the PCIe floor, expert bytes streamed per chunk over the pinned copy rate measured in
the same run. All resident: the larger of the expert bytes read over the device's read bandwidth and the routed
multiply-adds over the int8 matrix rate (torch._int_mm). The matrix floor is printed for offloaded runs too: a prompt
whose streaming hides under its compute cannot get near the PCIe floor.
"""

from __future__ import annotations

import statistics
import time
from types import SimpleNamespace

import torch

from strata.bench.ceilings import host_to_device_bandwidth, read_bandwidth, sync
from strata.engine.engine import Engine, EngineConfig
from strata.engine.experts import CachedExperts
from strata.engine.prefill import prompt_chunks
from strata.engine.prefill_stream import expected_coverage
from strata.errors import StrataError


def parse_contexts(text: str) -> list[int]:
    try:
        contexts = [int(t) for t in str(text).split(",") if t.strip()]
    except ValueError:
        contexts = []
    if not contexts or min(contexts) < 1:
        raise StrataError(f"--ctx must be comma-separated token counts, e.g. 4096,32768; got {text!r}")
    return contexts


def _streamer(engine: Engine):
    """The offloaded prompt streamer; a split's cards' streamers as one (their counters summed)."""
    backends = getattr(engine.model.experts, "backends", [engine.model.experts])
    streamers = [b.prompt for b in backends if isinstance(b, CachedExperts) and b.prompt is not None]
    if len(streamers) < 2:
        return streamers[0] if streamers else None
    return SimpleNamespace(stats=_SummedStats([s.stats for s in streamers]))


class Growth:
    """How much some running counters of `source` have grown since this was made: `growth.NAME`."""

    def __init__(self, source, *names: str):
        self._source = source
        self._start = {name: getattr(source, name) for name in names}

    def __getattr__(self, name: str):
        return getattr(self._source, name) - self._start[name]


class _SummedStats:
    def __init__(self, parts):
        self.parts = parts

    def __getattr__(self, name):
        return sum(getattr(p, name) for p in self.parts)


def time_prompt(engine: Engine, n_tokens: int, reps: int, seed: int) -> list[tuple[float, float]]:
    """(seconds until the last logits are on the host, seconds until the device is idle) for each of `reps` random
    prompts of n_tokens (each from position 0). The two differ by the copies that give a streamed prompt's lent
    cache slots back refilled (PromptStreamer.return_slots): queued on a copy stream as the prompt ends, they
    delay no logits (the first token's sampling waits for the compute stream only) and overlap what follows."""
    vocab = engine.model.config.vocab_size
    times = []
    for rep in range(reps):
        ids = torch.randint(0, vocab, (n_tokens,), generator=torch.Generator().manual_seed(seed + rep)).tolist()
        engine.cached_tokens = []  # nothing to reuse: the whole prompt is read
        sync(engine.device)
        start = time.perf_counter()
        logits = engine.prefill(ids)
        logits.cpu()  # waits for the compute stream only
        ready = time.perf_counter() - start
        sync(engine.device)
        times.append((ready, time.perf_counter() - start))
    return times


def routed_work(engine: Engine, n_tokens: int) -> tuple[int, int]:
    """(routed multiply-adds, expert bytes read) of a prompt of n_tokens: each chunk reads every expert it routes to
    once per layer (expected count, independent routing)."""
    c, stacks = engine.model.config, engine.model.expert_stacks
    mads = n_tokens * c.n_experts_used * 3 * c.n_embd * c.expert_ff * len(stacks)
    equal = isinstance(engine.config.prefill_chunk, str)
    read = sum(expected_coverage(end - begin, c.n_experts_used, c.n_experts) * s.n_bytes
               for begin, end in prompt_chunks(n_tokens, engine.prefill_chunk, equal) for s in stacks.values())
    return mads, int(read)


def bench_prompt(args, placement: dict) -> None:
    contexts = parse_contexts(args.ctx)
    engine = Engine(args.model, EngineConfig(device=args.device, dtype=args.dtype, kv_dtype=args.kv_dtype,
                                             prefill_chunk=args.prefill, n_ctx=max(contexts), **placement))
    device, streamer = engine.device, _streamer(engine)
    if getattr(args, "routing", "model") == "balanced":
        engine.model.balanced_prompt_routing = True
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    print(f"model      {engine.file.path.name} ({engine.model.config.arch}), device {name}, dtype {engine.dtype}")
    print(engine.plan.describe())
    if engine.model.balanced_prompt_routing:
        print("routing    balanced (a load test: each chunk's tokens spread evenly over all experts, as a trained "
              "model routes; outputs are not the model's)")
    chunk = engine.chunk_plan
    borrowed = (f", expert work buffers in {chunk.work_slots} borrowed cache slots "
                f"({chunk.work_slots * engine.plan.expert_bytes_each / 2**30:.2f} GiB; {chunk.free_tokens} tokens "
                "without borrowing)" if chunk.work_slots else ", no cache slots borrowed")
    print(f"chunks     up to {engine.prefill_chunk} tokens{borrowed}; median of {args.reps}")
    from strata.bench.moe_prefill import int8_rate

    int8_ops = int8_rate(device)
    read_rate = read_bandwidth(device, (1 << 30) if device.type == "cuda" else 1 << 26)  # the CPU: a tool check
    pcie_rate = host_to_device_bandwidth(device) if device.type == "cuda" else float("nan")
    print(f"ceilings   int8 {int8_ops / 1e12:.1f} TOPS, device reads {read_rate / 1e9:.0f} GB/s, "
          f"pinned host->device {pcie_rate / 1e9:.1f} GB/s")
    time_prompt(engine, min(contexts[0], engine.prefill_chunk), 1, seed=999)  # compiles the kernels
    ngram = getattr(engine.model, "ngram_prefetch", None)  # qwen4exp: the n-gram rows gathered on a host thread
    saves = engine.checkpoints.stats if engine.checkpoints is not None else None
    for n_tokens in contexts:
        waited = Growth(ngram, "waited_s") if ngram is not None else None
        saved = Growth(saves, "save_s", "saved_bytes", "reserved_s", "reserved_bytes") if saves is not None else None
        stream = Growth(streamer.stats, "bytes_streamed", "bytes_late", "chunks", "layers", "host_s", "sync_s",
                        "lend_s", "refill_s") if streamer else None
        calls_made = Growth(streamer, "copy_calls") if streamer else None
        runs = time_prompt(engine, n_tokens, args.reps, seed=n_tokens)
        seconds = statistics.median(ready for ready, _ in runs)
        idle = statistics.median(done for _, done in runs)
        mads, read = routed_work(engine, n_tokens)
        matrix_floor = 2 * mads / int8_ops
        n_chunks = len(prompt_chunks(n_tokens, engine.prefill_chunk, isinstance(engine.config.prefill_chunk, str)))
        print(f"\nctx {n_tokens:>7}: {n_tokens / seconds:9.1f} tok/s ({seconds:.3f} s to the last logits, {n_chunks} "
              f"chunks; the device idle {(idle - seconds) * 1e3:.1f} ms later: {n_tokens / idle:.1f} tok/s)")
        if len(runs) > 1:  # a first run slower than the others: something cold (pages, caches), not the steady rate
            print(f"  each run     {', '.join(f'{ready:.3f}' for ready, _ in runs)} s to the last logits, in order")
        print(f"  matrix floor {matrix_floor:.3f} s ({2 * mads / 1e12:.1f} T int8 ops); "
              f"{seconds / matrix_floor:.1f}x the floor")
        if engine.plan.all_resident:
            read_floor = read / read_rate
            floor = max(read_floor, matrix_floor)
            print(f"  read floor   {read_floor:.3f} s ({read / 1e9:.1f} GB of experts read); all resident: "
                  f"{seconds / floor:.1f}x the larger floor")
        elif streamer is not None:
            streamed, late, chunks = (stream.bytes_streamed / args.reps, stream.bytes_late / args.reps,
                                      stream.chunks / args.reps)
            pcie_floor = streamed / pcie_rate if streamed else float("nan")  # all hits: no PCIe floor
            print(f"  PCIe floor   {pcie_floor:.3f} s: {streamed / 1e9:.2f} GB streamed in {chunks:.0f} chunks "
                  f"({streamed / max(chunks, 1) / 1e9:.2f} GB per chunk, {late / max(streamed, 1):.0%} after the "
                  f"router); {seconds / pcie_floor:.2f}x the PCIe floor, "
                  f"{seconds / max(pcie_floor, matrix_floor):.2f}x the larger floor")
            layers = max(stream.layers, 1)
            print(f"  streaming host {stream.host_s * 1e3 / layers:.3f} ms a routed layer "
                  f"(bookkeeping and copy launches), waiting for its routing {stream.sync_s * 1e3 / layers:.3f} ms")
            queue = streamer.queue
            calls = (f": {calls_made.copy_calls / layers:.0f} copy calls a routed layer by {queue.copied_by}"
                     if queue.dma else "")
            early = ", next layer queued " + ("early" if streamer.early else "after the launch")
            print(f"  streamed by  STRATA_PF_STREAM={queue.form}{calls}{early}")
            print(f"  lent slots   {stream.lend_s * 1e3 / args.reps:.1f} ms a prompt on the host lending them at its "
                  f"start, {stream.refill_s * 1e3 / args.reps:.1f} ms queueing their refill at its end")
        else:
            print("  experts offloaded without streaming (--prefill-stream off, or a cache too small to lend a ring)")
        if saves is not None:  # a hybrid model's cache is saved at each prompt's end (engine/checkpoints.py)
            ahead = (f"; before it {saved.reserved_s * 1e3 / args.reps:.1f} ms pinning "
                     f"{saved.reserved_bytes / args.reps / 1e6:.1f} MB of slabs in the routing waits"
                     if saved.reserved_bytes else "")  # STRATA_CHECKPOINT_AHEAD
            print(f"  checkpoint   {saved.save_s * 1e3 / args.reps:.1f} ms a prompt on the host, "
                  f"{saved.saved_bytes / args.reps / 1e6:.1f} MB copied to host RAM{ahead}")
        if ngram is not None:  # a cold page cache under the table's shard shows here (gguf/access_advice.py)
            print(f"  n-gram rows  the forwards waited {waited.waited_s * 1e3 / args.reps:.1f} ms a "
                  "prompt for the host thread's table lookups")
