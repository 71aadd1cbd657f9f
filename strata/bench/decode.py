"""`strata bench decode`: decode tokens/s with the experts placed as asked, beside the floor of that placement.

Step by step: the mean, the median and the worst step, and how many steps adapted the expert cache (issue 4: the
steps that adapt are the ones that used to stall). The floor of an offloaded run is the issue's: the largest of
PCIe-side miss bytes / the pinned copy rate, CPU-side miss bytes / the host's rate, and the GPU's time a token,
measured as the device time of a decode step of the same model with every expert resident where that fits
(`--gpu-floor resident`; an all-resident run prints it, to pass as `--gpu-floor MS`), else estimated from the bytes
the GPU reads (dense weights and the hits' experts at the device's copy bandwidth).
"""

from __future__ import annotations

import gc
import time

import torch

from strata.bench.ceilings import host_to_device_bandwidth, read_bandwidth, sync
from strata.bench.decode_pdl import pdl_modes, pdl_sweep
from strata.engine.engine import Engine, EngineConfig
from strata.engine.experts import CachedExperts
from strata.engine.sampling import SamplingParams
from strata.errors import StrataError

WARM_STEPS = 3  # the first decode steps compile kernels and capture the span's graph: not the steady rate
GPU_FLOORS = ("resident", "bytes")
DEVICE_STEP = "the median device time of a decode step (its launches queued before it starts)"
SLEEP_CYCLES = 40_000_000  # ~20 ms of GPU clock: longer than the host takes to queue a step's launches


def bench_decode(args, placement: dict) -> None:
    gpu_floor_option = getattr(args, "gpu_floor", "resident")
    _given_ms(gpu_floor_option)  # bad values say so before anything loads
    sweep = adapt_configs(getattr(args, "adapt_sweep", "") or "")
    pdl = pdl_modes(getattr(args, "pdl_sweep", "") or "")
    n_ctx = args.ctx or args.prompt_tokens + args.tokens + WARM_STEPS + 8
    engine = _engine(args, n_ctx, placement)
    device, c = engine.device, engine.model.config
    backend = engine.model.experts
    prompt = torch.randint(0, c.vocab_size, (args.prompt_tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    cached = [b for b in getattr(backend, "backends", [backend]) if isinstance(b, CachedExperts)]  # a split: per card
    offloaded = bool(cached)
    run = _timed_steps(engine, prompt, args.tokens, cached)
    decoder = engine.decoder
    n, seconds = len(run.steps), sum(run.steps)
    print(f"model      {engine.file.path.name}, device {device}, {n} decode tokens after {len(prompt)} prompt tokens")
    print(engine.plan.describe())
    graphs = "off (step by step)" if decoder is None else (
        f"captured ({len(decoder.programs)} span(s), {run.new_spans} captured while timed"
        f"{f', those steps left out: {run.capture_seconds * 1e3:.0f} ms' if run.new_spans else ''}{_cards(decoder)})"
        if decoder.capture else "static steps, uncaptured")
    print(f"decode     {n / seconds:.2f} tok/s ({seconds / n * 1e3:.1f} ms/token); CUDA graphs {graphs}")
    print(f"steps      median {run.median * 1e3:.2f} ms = {1 / run.median:.2f} tok/s; worst {run.worst * 1e3:.2f} ms "
          f"(step {run.worst_index}{', adapting' if run.adapted[run.worst_index] else ''})")
    expert_each = engine.plan.expert_bytes_each
    dense_read = engine.plan.dense_read_bytes  # every dense weight once per token, in one of its copies
    device_rate = read_bandwidth(device)  # bytes/s a read-only stream gets: the copy's whole traffic, measured once
    gpu_bytes_floor = dense_read / device_rate
    if not offloaded:
        active = engine.plan.expert_bytes * c.n_experts_used // max(c.n_experts, 1)
        floor = (dense_read + active) / device_rate
        step = _device_step_seconds(engine, prompt, args.tokens)
        print(f"GPU step   {step * 1e3:.2f} ms: {DEVICE_STEP}")
        print(f"floor      {floor * 1e3:.2f} ms/token (all resident: bytes read / device bandwidth); "
              f"decode reaches {floor / (seconds / n):.1%} of it")
        if pdl:
            pdl_sweep(engine, prompt, args.tokens, run, step, pdl, lambda e, p, k: _timed_steps(e, p, k, cached),
                      _device_step_seconds)
        return
    adapting = [t for t, a in zip(run.steps, run.adapted) if a]
    others = [t for t, a in zip(run.steps, run.adapted) if not a]
    print(f"adapting   {len(adapting)} of {n} steps adapted the cache ({run.swaps} swaps, "
          f"{run.bytes_moved / n / 1e6:.1f} MB/token copied into slots); median step "
          f"{_median(adapting) * 1e3:.2f} ms adapting, {_median(others) * 1e3:.2f} ms not")
    hits, misses, cpu_bytes, cpu_seconds, pcie_bytes, cpu_calls = run.counters
    cpu_rate = device_rate if device.type == "cpu" else read_bandwidth(torch.device("cpu"))
    pcie_rate = host_to_device_bandwidth(device) if device.type == "cuda" else float("nan")
    hit_rate = hits / (hits + misses) if hits + misses else float("nan")
    print(f"experts    hit rate {hit_rate:.1%}; misses {misses / n:.1f} per token = {misses * expert_each / n / 1e6:.1f} MB")
    print(f"CPU pool   {cpu_bytes / n / 1e6:.1f} MB/token at {cpu_bytes / cpu_seconds / 1e9 if cpu_seconds else 0:.2f} GB/s "
          f"(host memory reads at {cpu_rate / 1e9:.1f} GB/s); {cpu_calls / n:.1f} calls, "
          f"{cpu_seconds / n * 1e3:.2f} ms a token in the pool")
    print(f"PCIe       {pcie_bytes / n / 1e6:.1f} MB/token (pinned copies at {pcie_rate / 1e9:.1f} GB/s)")
    if decoder is not None and decoder.host_seconds:  # the routed layers' doorbell loop, where a token's time goes
        parts = ", ".join(f"{name} {spent / n * 1e3:.2f}" for name, spent in run.host_seconds.items())
        print(f"host loop  ms a token: {parts} (doorbell wait: the GPU's segment up to a routing)")
    if sweep:
        _adapt_sweep(engine, prompt, args.tokens, cached, run, sweep)
    if pdl:
        pdl_sweep(engine, prompt, args.tokens, run, None, pdl, lambda e, p, k: _timed_steps(e, p, k, cached), None)
    gpu_part = ("GPU bytes read / device bandwidth",
                gpu_bytes_floor + hits * expert_each / n / device_rate)
    given = _given_ms(gpu_floor_option)
    if given is not None:
        print(f"GPU step   {given:.2f} ms: given (--gpu-floor), an all-resident run's device time a step")
        gpu_part = ("GPU time per token (all-resident step)", given / 1e3)
    elif gpu_floor_option == "resident":
        del engine, backend, cached, decoder  # the offloaded run's memory back before the resident one loads
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        resident = _resident_device_step(args, n_ctx, placement, prompt)
        if resident is None:
            print("GPU step   the model does not fit on the device with every expert resident: the GPU part of the "
                  "floor is estimated from the bytes it reads")
        else:
            print(f"GPU step   {resident * 1e3:.2f} ms: the same model with every expert resident, {DEVICE_STEP}")
            gpu_part = ("GPU time per token (all-resident step)", resident)
    parts = {
        "CPU-side miss bytes / host bandwidth": cpu_bytes / n / cpu_rate,
        "PCIe-side miss bytes / pinned copy rate": pcie_bytes / n / pcie_rate if pcie_bytes else 0.0,
        gpu_part[0]: gpu_part[1],
    }
    bound, floor = max(parts.items(), key=lambda kv: kv[1])
    print(f"floor      {floor * 1e3:.2f} ms/token ({bound}); decode is {seconds / n / floor:.2f}x the floor "
          f"(median step {run.median / floor:.2f}x)")


class TimedRun:
    """One timed decode: each step's seconds, whether it adapted the cache, and the counters' deltas."""

    def __init__(self):
        self.steps: list[float] = []
        self.adapted: list[bool] = []
        self.counters: tuple = ()
        self.swaps = self.bytes_moved = self.new_spans = 0
        self.capture_seconds = 0.0  # steps that captured a new span's graphs: left out of `steps`
        self.host_seconds: dict = {}

    @property
    def median(self) -> float:
        return _median(self.steps)

    @property
    def worst(self) -> float:
        return max(self.steps, default=float("nan"))

    @property
    def worst_index(self) -> int:
        return max(range(len(self.steps)), key=self.steps.__getitem__, default=0)


def _timed_steps(engine, prompt: list[int], n_tokens: int, cached: list[CachedExperts]) -> TimedRun:
    """Greedy decode of n_tokens after the prompt and WARM_STEPS untimed steps. A step is timed from one token's
    arrival on the host to the next (the sampler reads each token, so no extra sync is needed)."""
    run = TimedRun()
    tokens = engine.generate(prompt, SamplingParams(temperature=0), n_tokens + 1 + WARM_STEPS, stop_ids=frozenset())
    for _ in range(1 + WARM_STEPS):  # the prompt, and the first token from it, are not decode
        next(tokens)
    decoder = engine.decoder
    spans_before = len(decoder.programs) if decoder is not None else 0
    host_before = dict(decoder.host_seconds) if decoder is not None else {}
    before = _counters(cached) if cached else ()
    caches = [b.cache for b in cached]
    swaps_before, moved_before = (sum(c.stats.swaps for c in caches), sum(c.stats.bytes_moved for c in caches))
    adapts = sum(c.stats.adapts for c in caches)
    sync(engine.device)
    last = time.perf_counter()
    spans = spans_before
    for _ in tokens:
        now = time.perf_counter()
        spans_now = len(decoder.programs) if decoder is not None else 0
        adapts_now = sum(c.stats.adapts for c in caches)  # host integers: nothing read from the device
        if spans_now > spans:  # the step crossed into a longer span and captured its graphs: once a process, not
            run.capture_seconds += now - last  # decode's rate (a 256-token run crosses 256 cells: ~1 s of capture)
        else:
            run.steps.append(now - last)
            run.adapted.append(adapts_now > adapts)
        spans, last, adapts = spans_now, now, adapts_now
    sync(engine.device)
    if cached:
        run.counters = tuple(a - b for a, b in zip(_counters(cached), before))
    run.swaps = sum(c.stats.swaps for c in caches) - swaps_before
    run.bytes_moved = sum(c.stats.bytes_moved for c in caches) - moved_before
    if decoder is not None:
        run.new_spans = len(decoder.programs) - spans_before
        run.host_seconds = {k: v - host_before.get(k, 0.0) for k, v in decoder.host_seconds.items()}
    return run


def _resident_device_step(args, n_ctx: int, placement: dict, prompt: list[int]) -> float | None:
    """The device time of a decode step of the same model with every expert on the device, or None where they do not
    fit (decided by the placement plan before anything loads)."""
    from strata.engine.kv import check_kind, kv_bytes_per_value
    from strata.engine.placement import plan_placement
    from strata.gguf.reader import GGUFModelFile
    from strata.models import config_of

    options = dict(placement, vram_budget=None, expert_cache="auto", gpus=None, layer_split="auto")
    config = EngineConfig(device=args.device, dtype=args.dtype, kv_dtype=args.kv_dtype, prefill_chunk=args.prefill,
                          n_ctx=n_ctx, **options)
    file = GGUFModelFile(args.model)
    model_config = config_of(file)
    kv_dtype = check_kind(config.kv_dtype, model_config.head_dim)
    plan = plan_placement(file, model_config, config.resolve_device(), n_ctx, kv_bytes_per_value(kv_dtype))
    if not plan.all_resident:
        return None
    engine = Engine(args.model, config)
    seconds = _device_step_seconds(engine, prompt, args.tokens)
    del engine
    gc.collect()
    return seconds


def _device_step_seconds(engine, prompt: list[int], n_tokens: int) -> float:
    """The median time the device spends on one greedy decode step, without the host's share: on a GPU, a sleep
    kernel holds the stream while the host queues the step, and CUDA events time the step alone (the wall clock of
    a step also counts the sampler and the engine's Python, issue 4's "GPU time per token" does not); on the CPU,
    the wall clock."""
    cuda = engine.device.type == "cuda"
    logits = engine.prefill(prompt)
    token, position, times = int(logits[-1].argmax()), len(prompt), []
    start, end = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if cuda else (None, None)
    for i in range(WARM_STEPS + n_tokens):
        if cuda:
            torch.cuda._sleep(SLEEP_CYCLES)
            start.record()
        t0 = time.perf_counter()
        logits = engine.decode(token, position)
        if cuda:
            end.record()
        token = int(logits[-1].argmax())  # waits for the step
        if i >= WARM_STEPS:
            times.append(start.elapsed_time(end) / 1e3 if cuda else time.perf_counter() - t0)
        position += 1
    return _median(times)


def adapt_configs(text: str) -> list[tuple[int, int]]:
    """--adapt-sweep "4x96,2x48": (adapt_every, adapt_swaps) pairs."""
    configs = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        every, _, swaps = part.partition("x")
        if not (every.isdigit() and swaps.isdigit() and int(every) > 0 and int(swaps) > 0):
            raise StrataError(f"--adapt-sweep takes EVERYxSWAPS pairs such as 4x96,2x48, got {part!r}")
        configs.append((int(every), int(swaps)))
    return configs


def _adapt_sweep(engine, prompt: list[int], n_tokens: int, cached: list[CachedExperts], default: TimedRun,
                 configs: list[tuple[int, int]]) -> None:
    """The same decode again for each (adapt_every, adapt_swaps), on the loaded engine (the prompt again, its
    warm steps, then the timed ones), one row each beside the run above (the default's row)."""
    caches = [b.cache for b in cached]
    first = caches[0]
    print("adapt sweep (every x swaps: tok/s, median / worst step ms, hit rate, MB/token into slots)")
    rows = [(f"{first.adapt_every}x{first.adapt_swaps} (default)", default)]
    saved = [(c.adapt_every, c.adapt_swaps) for c in caches]
    for every, swaps in configs:
        for c in caches:
            c.adapt_every, c.adapt_swaps = every, swaps
        rows.append((f"{every}x{swaps}", _timed_steps(engine, prompt, n_tokens, cached)))
    for c, (every, swaps) in zip(caches, saved):
        c.adapt_every, c.adapt_swaps = every, swaps
    for name, run in rows:
        n, hits, misses = len(run.steps), run.counters[0], run.counters[1]
        rate = hits / (hits + misses) if hits + misses else float("nan")
        speed = n / sum(run.steps) / (len(default.steps) / sum(default.steps))
        print(f"  {name:<16} {n / sum(run.steps):8.2f} tok/s ({speed:.2f}x)  {run.median * 1e3:6.2f} / "
              f"{run.worst * 1e3:6.2f} ms  {rate:6.1%}  {run.bytes_moved / n / 1e6:6.1f}")


def _given_ms(option: str) -> float | None:
    """--gpu-floor: None for resident or bytes, else the milliseconds given."""
    if option in GPU_FLOORS:
        return None
    try:
        ms = float(option)
    except ValueError:
        ms = -1.0
    if not ms > 0:
        raise StrataError(f"--gpu-floor must be resident, bytes or a positive number of ms, got {option!r}")
    return ms


def _engine(args, n_ctx: int, placement: dict) -> Engine:
    return Engine(args.model, EngineConfig(device=args.device, dtype=args.dtype, kv_dtype=args.kv_dtype,
                                           prefill_chunk=args.prefill, n_ctx=n_ctx, **placement))


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else float("nan")


def _cards(decoder) -> str:
    """A split's decoder (engine/decode_split.py) captures each card's layers on that card."""
    n = getattr(decoder, "n_stages", 1)
    return f", on each of {n} cards" if n > 1 else ""


def _counters(backends: list[CachedExperts]) -> tuple:
    """(hits, misses, CPU pool bytes, CPU pool seconds, PCIe bytes, CPU pool calls) summed over the cards' offloaded
    backends (`--misses direct`: every miss's bytes cross PCIe, read by the GPU's kernels)."""
    for b in backends:
        if b.direct:
            b.cache.device_table.read_stats()  # counted on the device, not yet taken in: read now (a sync)
    direct = sum(b.cache.stats.misses * next(iter(b.host_stacks.values())).expert_bytes for b in backends if b.direct)
    pools = list({id(b.pool): b.pool for b in backends}.values())  # a split's cards share one pool
    return (sum(b.cache.stats.hits for b in backends), sum(b.cache.stats.misses for b in backends),
            sum(p.stats.bytes for p in pools), sum(p.stats.seconds for p in pools), direct + sum(b.pcie_bytes for b in backends),
            sum(p.stats.calls for p in pools))
