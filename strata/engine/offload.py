"""Putting together the offloaded expert path: host stacks (pinned or mapped), the GPU cache and the CPU pool."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from strata.engine.cpu_pool import CPUExpertPool
from strata.engine.expert_cache import ExpertCache, Key
from strata.engine.experts import PROMPT_KERNEL_MIN_TOKENS, CachedExperts, ExpertStack
from strata.engine.placement import PlacementPlan
from strata.engine.prefill_stream import PromptStreamer
from strata.errors import StrataError
from strata.models.weights import QuantWeight


def pinned(stacks: dict[int, ExpertStack]) -> dict[int, ExpertStack]:
    """Copies of the stacks in page-locked RAM: PCIe copies from there run at full speed, from pageable at ~1/7."""

    def pin(w: QuantWeight) -> QuantWeight:
        raw = torch.empty(w.raw.shape, dtype=torch.uint8, pin_memory=True)
        raw.copy_(w.raw)
        return QuantWeight(w.name, w.ggml_type, w.shape, raw)

    return {layer: ExpertStack(pin(s.gate), pin(s.up), pin(s.down)) for layer, s in stacks.items()}


def load_profile(path: str, stacks: dict[int, ExpertStack]) -> list[Key]:
    """A `strata profile` file -> every (layer, expert) it counted, most routed first."""
    try:
        counts = json.loads(Path(path).read_text())["counts"]
        ranked = [(c, int(layer), e) for layer, row in counts.items() for e, c in enumerate(row)]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StrataError(f"{path}: not a routing profile from `strata profile` ({exc})") from None
    keys = [(layer, e) for c, layer, e in sorted(ranked, key=lambda t: (-t[0], t[1], t[2]))]
    for layer, e in keys:
        if layer not in stacks or e >= stacks[layer].n_experts:
            raise StrataError(f"{path}: routing profile names expert {e} of layer {layer}, which this model lacks")
    return keys


def offloaded_experts(stacks: dict[int, ExpertStack], plan: PlacementPlan, device: torch.device, config,
                      ranking: list[Key] | None = None) -> CachedExperts:
    """`ranking`: the experts to fill the cache with, in order (a split's card: its layers' share of the profile);
    by default the routing profile of config.expert_profile, else an even spread."""
    host = pinned(stacks) if device.type == "cuda" and config.pin_experts else stacks
    cache = ExpertCache(host, plan.n_slots, device)  # with 0 slots it still counts every routing as a miss
    if ranking is None:
        ranking = load_profile(config.expert_profile, stacks) if config.expert_profile else cache.even_ranking()
    cache.fill(ranking)
    pool = CPUExpertPool(host, config.cpu_threads, config.cpu_spin_us)
    return CachedExperts(host, cache, pool, device, config.pcie_frac,
                         prompt_streamer(host, cache, device, config.prefill_stream), config.misses)


STREAM_MODES = ("auto", "on", "off")


def prompt_streamer(host: dict[int, ExpertStack], cache: ExpertCache, device: torch.device, mode: str):
    """`prefill_stream`: "auto" streams prompt chunks of >= 32 tokens on a GPU (the prompt kernels' threshold), "on"
    every chunk of >= 2 tokens on any device (CPU tests run the GPU's code path), "off" keeps the CPU pool."""
    if mode not in STREAM_MODES:
        raise StrataError(f"--prefill-stream must be one of {', '.join(STREAM_MODES)}, got {mode!r}")
    if mode == "off" or (mode == "auto" and device.type != "cuda"):
        return None
    return PromptStreamer(host, cache, device, PROMPT_KERNEL_MIN_TOKENS if mode == "auto" else 2)
