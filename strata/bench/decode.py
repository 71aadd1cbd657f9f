"""`strata bench decode`: decode tokens/s with the experts placed as asked, beside the floor of that placement."""

from __future__ import annotations

import time

import torch

from strata.bench.ceilings import copy_bandwidth, host_to_device_bandwidth, sync
from strata.engine.engine import Engine, EngineConfig
from strata.engine.experts import CachedExperts
from strata.engine.sampling import SamplingParams


def bench_decode(args, placement: dict) -> None:
    n_ctx = args.ctx or args.prompt_tokens + args.tokens + 8
    engine = Engine(args.model, EngineConfig(device=args.device, dtype=args.dtype, kv_dtype=args.kv_dtype,
                                             prefill_chunk=args.prefill, n_ctx=n_ctx, **placement))
    device, c = engine.device, engine.model.config
    backend = engine.model.experts
    prompt = torch.randint(0, c.vocab_size, (args.prompt_tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    warm = 3  # the first decode steps compile kernels and capture the span's graph: not the steady rate
    tokens = engine.generate(prompt, SamplingParams(temperature=0), args.tokens + 1 + warm, stop_ids=frozenset())
    for _ in range(1 + warm):  # the prompt, and the first token from it, are not decode
        next(tokens)
    decoder = engine.decoder
    spans_before = len(decoder.programs) if decoder is not None else 0
    cached = [b for b in getattr(backend, "backends", [backend]) if isinstance(b, CachedExperts)]  # a split: per card
    offloaded = bool(cached)
    if offloaded:
        before = _counters(cached)
    host_before = dict(decoder.host_seconds) if decoder is not None else {}
    sync(device)
    start = time.perf_counter()
    steps = []
    for _ in tokens:  # each token is on the host already (the sampler read it), so the steps need no extra sync
        steps.append(time.perf_counter())
    sync(device)
    seconds = time.perf_counter() - start
    n = len(steps)
    step_seconds = sorted(b - a for a, b in zip([start] + steps, steps))
    median = step_seconds[len(step_seconds) // 2] if step_seconds else float("nan")
    print(f"model      {engine.file.path.name}, device {device}, {n} decode tokens after {len(prompt)} prompt tokens")
    print(engine.plan.describe())
    new_spans = (len(decoder.programs) - spans_before) if decoder is not None else 0
    graphs = "off (step by step)" if decoder is None else (
        f"captured ({len(decoder.programs)} span(s), {new_spans} captured while timed{_cards(decoder)})"
        if decoder.capture else "static steps, uncaptured")
    print(f"decode     {n / seconds:.2f} tok/s ({seconds / n * 1e3:.1f} ms/token; median step {median * 1e3:.1f} ms "
          f"= {1 / median:.2f} tok/s); CUDA graphs {graphs}")
    expert_each = engine.plan.expert_bytes_each
    dense_read = engine.plan.dense_bytes  # every dense weight once per token (a tied head is counted once)
    gpu_floor = dense_read / (copy_bandwidth(device) / 2)
    if not offloaded:
        active = engine.plan.expert_bytes * c.n_experts_used // max(c.n_experts, 1)
        floor = (dense_read + active) / (copy_bandwidth(device) / 2)
        print(f"floor      {floor * 1e3:.2f} ms/token (all resident: bytes read / device bandwidth); "
              f"decode reaches {floor / (seconds / n):.1%} of it")
        return
    hits, misses, cpu_bytes, cpu_seconds, pcie_bytes, cpu_calls = (a - b for a, b in zip(_counters(cached), before))
    cpu_rate = copy_bandwidth(torch.device("cpu")) / 2
    pcie_rate = host_to_device_bandwidth(device) if device.type == "cuda" else float("nan")
    hit_rate = hits / (hits + misses) if hits + misses else float("nan")
    print(f"experts    hit rate {hit_rate:.1%}; misses {misses / n:.1f} per token = {misses * expert_each / n / 1e6:.1f} MB")
    print(f"CPU pool   {cpu_bytes / n / 1e6:.1f} MB/token at {cpu_bytes / cpu_seconds / 1e9 if cpu_seconds else 0:.2f} GB/s "
          f"(host memory reads at {cpu_rate / 1e9:.1f} GB/s); {cpu_calls / n:.1f} calls, "
          f"{cpu_seconds / n * 1e3:.2f} ms a token in the pool")
    print(f"PCIe       {pcie_bytes / n / 1e6:.1f} MB/token (pinned copies at {pcie_rate / 1e9:.1f} GB/s)")
    if decoder is not None and decoder.host_seconds:  # the routed layers' doorbell loop, where a token's time goes
        parts = ", ".join(f"{name} {(spent - host_before.get(name, 0.0)) / n * 1e3:.2f}"
                          for name, spent in decoder.host_seconds.items())
        print(f"host loop  ms a token: {parts} (doorbell wait: the GPU's segment up to a routing)")
    parts = {
        "CPU-side miss bytes / host bandwidth": cpu_bytes / n / cpu_rate,
        "PCIe-side miss bytes / pinned copy rate": pcie_bytes / n / pcie_rate if pcie_bytes else 0.0,
        "GPU bytes read / device bandwidth": gpu_floor + hits * expert_each / n / (copy_bandwidth(device) / 2),
    }
    bound, floor = max(parts.items(), key=lambda kv: kv[1])
    print(f"floor      {floor * 1e3:.2f} ms/token ({bound}); decode is {seconds / n / floor:.1f}x the floor")


def _cards(decoder) -> str:
    """A split's decoder (engine/decode_split.py) captures each card's layers on that card."""
    n = getattr(decoder, "n_stages", 1)
    return f", on each of {n} cards" if n > 1 else ""


def _counters(backends: list[CachedExperts]) -> tuple:
    """(hits, misses, CPU pool bytes, CPU pool seconds, PCIe bytes, CPU pool calls) summed over the cards' offloaded
    backends (`--misses direct`: every miss's bytes cross PCIe, read by the GPU's kernels)."""
    for b in backends:
        if b.direct:
            b.cache.device_table.collect(b.cache.decay)  # counted on the device since the last adapt
    direct = sum(b.cache.stats.misses * next(iter(b.host_stacks.values())).expert_bytes for b in backends if b.direct)
    pools = list({id(b.pool): b.pool for b in backends}.values())  # a split's cards share one pool
    return (sum(b.cache.stats.hits for b in backends), sum(b.cache.stats.misses for b in backends),
            sum(p.stats.bytes for p in pools), sum(p.stats.seconds for p in pools), direct + sum(b.pcie_bytes for b in backends),
            sum(p.stats.calls for p in pools))
