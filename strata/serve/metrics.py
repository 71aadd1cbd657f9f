"""What the server counts: Prometheus metrics at /metrics, and the same figures as JSON for the monitor page."""

from __future__ import annotations

import math
import os
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from strata.engine.generation import Stats


def process_rss_bytes() -> int:
    """Resident memory of this process (Linux /proc; 0 where it cannot be read)."""
    try:
        with open("/proc/self/statm") as file:
            return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def host_memory_bytes() -> tuple[int, int]:
    """(total, available) RAM of the host, from /proc/meminfo; zeros where it cannot be read."""
    fields = {}
    try:
        with open("/proc/meminfo") as file:
            for line in file:
                name, _, rest = line.partition(":")
                fields[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return 0, 0
    return fields.get("MemTotal", 0), fields.get("MemAvailable", 0)


def gpu_memory_bytes(engine) -> dict | None:
    """The engine's GPU memory: what its tensors take, what the allocator holds, the card's total (None on CPU)."""
    device = getattr(engine, "device", None)
    if device is None or device.type != "cuda":
        return None
    import torch

    return {"allocated": torch.cuda.memory_allocated(device), "reserved": torch.cuda.memory_reserved(device),
            "total": torch.cuda.get_device_properties(device).total_memory}


def expert_cache_hit_rate(engine) -> float:
    """The GPU expert cache's hit rate since start (a layer split: over its cards' caches); NaN where the experts are
    all resident (no cache)."""
    experts = getattr(engine.model, "experts", None)
    caches = [getattr(b, "cache", None) for b in getattr(experts, "backends", [experts])]
    stats = [c.stats for c in caches if isinstance(getattr(getattr(c, "stats", None), "hits", None), int)]
    lookups = sum(s.hits + s.misses for s in stats)
    return sum(s.hits for s in stats) / lookups if lookups else math.nan


def checkpoint_figures(engine) -> tuple[int, int]:
    """(checkpoints kept, their bytes); zeros when the engine keeps none."""
    store = getattr(engine, "checkpoints", None)
    return (len(store), store.n_bytes) if store is not None else (0, 0)


class Metrics:
    def __init__(self, engine, queue_length, running):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("strata_requests", "requests answered, by endpoint and status code",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("strata_prompt_tokens", "prompt tokens read", registry=r)
        self.cached_tokens = Counter("strata_prompt_cached_tokens", "prompt tokens taken from the cached prefix",
                                     registry=r)
        self.checkpoint_tokens = Counter("strata_prompt_checkpoint_tokens",
                                         "prompt tokens restored from a checkpoint of an earlier conversation",
                                         registry=r)
        self.checkpoint_restores = Counter("strata_checkpoint_restores", "requests that restored a checkpoint",
                                           registry=r)
        self.generated_tokens = Counter("strata_generated_tokens", "tokens generated", registry=r)
        self.cancelled = Counter("strata_requests_cancelled", "requests whose client went away", registry=r)
        self.rejected = Counter("strata_requests_rejected_queue_full", "requests refused with 429", registry=r)
        self.prompt_tps = Gauge("strata_prompt_tokens_per_second", "prompt tokens/s of the last request", registry=r)
        self.decode_tps = Gauge("strata_decode_tokens_per_second", "decode tokens/s of the last request", registry=r)
        Gauge("strata_queue_length", "requests waiting", registry=r).set_function(queue_length)
        Gauge("strata_requests_running", "requests running (0 or 1)", registry=r).set_function(running)
        Gauge("strata_expert_cache_hit_rate", "expert cache hits / lookups (NaN: no expert cache)",
              registry=r).set_function(lambda: expert_cache_hit_rate(engine))
        Gauge("strata_checkpoints", "conversation checkpoints kept", registry=r).set_function(
            lambda: checkpoint_figures(engine)[0])
        Gauge("strata_checkpoint_bytes", "bytes of the conversation checkpoints", registry=r).set_function(
            lambda: checkpoint_figures(engine)[1])
        Gauge("strata_process_resident_bytes", "resident memory of the server", registry=r).set_function(
            process_rss_bytes)
        spec = getattr(engine, "spec", None)
        if spec is not None:  # --spec > 1: speculative decoding's counters since start
            for name, what, count in (
                    ("windows", "verify windows run", lambda: spec.stats.windows),
                    ("drafts_checked", "drafts checked against the model", lambda: sum(spec.stats.checked)),
                    ("drafts_accepted", "drafts accepted", lambda: sum(spec.stats.accepted))):
                Gauge(f"strata_spec_{name}", what + " (speculative decoding)", registry=r).set_function(count)
        self.started = time.time()
        self.last: dict = {}
        self._prompt_tps = self._decode_tps = 0.0

    def record(self, stats: Stats, finish: str) -> None:
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.cached_tokens.inc(stats.cached_tokens)
        self.checkpoint_tokens.inc(stats.checkpoint_tokens)
        if stats.checkpoint_tokens:
            self.checkpoint_restores.inc()
        self.generated_tokens.inc(stats.completion_tokens)
        if finish == "cancelled":
            self.cancelled.inc()
        if stats.prompt_seconds:
            self._prompt_tps = (stats.prompt_tokens - stats.cached_tokens) / stats.prompt_seconds
            self.prompt_tps.set(self._prompt_tps)
        if stats.decode_tokens_per_second:
            self._decode_tps = stats.decode_tokens_per_second
            self.decode_tps.set(self._decode_tps)
        self.last = {"prompt_tokens": stats.prompt_tokens, "cached_tokens": stats.cached_tokens,
                     "checkpoint_tokens": stats.checkpoint_tokens,
                     "completion_tokens": stats.completion_tokens, "finish_reason": finish,
                     "prompt_tokens_per_second": self._prompt_tps, "decode_tokens_per_second": self._decode_tps}

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def total(self, counter: Counter) -> float:
        return sum(sample.value for metric in counter.collect() for sample in metric.samples
                   if sample.name.endswith("_total"))
