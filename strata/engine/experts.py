"""Expert execution backends: how the routed experts of a MoE layer are computed. The model never knows which.

A backend's `start` launches the work and returns a handle; the model computes the shared expert meanwhile and
then calls `finish`, so experts computed elsewhere (the CPU pool) overlap with the GPU's own work.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import cached_property
from typing import Callable

import numpy as np
import torch

from strata.errors import StrataError
from strata.models.layers import swiglu
from strata.models.weights import QuantWeight, in_window


@dataclass
class ExpertStack:
    """One layer's routed experts as llama.cpp stacks them: gate/up [E, ff, embd], down [E, embd, ff]."""

    gate: QuantWeight
    up: QuantWeight
    down: QuantWeight

    @property
    def n_experts(self) -> int:
        return self.gate.shape[0]

    @property
    def n_bytes(self) -> int:
        return self.gate.n_bytes + self.up.n_bytes + self.down.n_bytes

    @property
    def expert_bytes(self) -> int:
        return self.n_bytes // self.n_experts

    def expert(self, e: int) -> tuple[QuantWeight, QuantWeight, QuantWeight]:
        return self.gate[e], self.up[e], self.down[e]


def swiglu_expert(weights: tuple[QuantWeight, QuantWeight, QuantWeight], x: torch.Tensor) -> torch.Tensor:
    """SwiGLU of one expert from its three quantized matrices, dequantized on use."""
    return swiglu(x, *weights)


def routed_tokens(ids: torch.Tensor) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """expert -> (token rows, top-k slot) of the tokens routed to it."""
    return {expert: (ids == expert).nonzero(as_tuple=True) for expert in ids.unique().tolist()}


def accumulate(out: torch.Tensor, routes: dict, weights: torch.Tensor, x: torch.Tensor,
               expert_weights: Callable[[int], tuple], experts) -> None:
    """out[token] += weight * expert(x[token]) for the given experts (all on out's device)."""
    for expert in experts:
        token, slot = routes[expert]
        y = swiglu_expert(expert_weights(expert), x[token])
        out.index_add_(0, token, y * weights[token, slot, None].to(x.dtype))


class PendingExperts:
    """The result of `ExpertBackend.start`; `finish()` waits for any part computed elsewhere and sums."""

    def __init__(self, out: torch.Tensor, finish: Callable[[torch.Tensor], torch.Tensor] | None = None):
        self._out, self._finish = out, finish

    def finish(self) -> torch.Tensor:
        return self._finish(self._out) if self._finish else self._out


class ExpertBackend(ABC):
    name: str

    @abstractmethod
    def start(self, layer: int, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> PendingExperts:
        """Begin sum over each token's chosen experts of weight * expert(x). x: [T, embd]; weights, ids: [T, k]."""

    def run(self, layer: int, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self.start(layer, x, weights, ids).finish()

    def end_step(self) -> None:
        """Called once per forward step, after the last layer (caches adapt here)."""


PROMPT_KERNEL_MIN_TOKENS = 32  # below this a chunk is decode-like: too few rows per expert for grouped GEMMs


def kernel_path(stack: ExpertStack, x: torch.Tensor) -> str | None:
    """Which Triton expert kernels take this step: "prompt" (grouped GEMMs) for chunks of many tokens, "decode"
    (one-launch GEMV) for a few; None keeps the reference loop: on the CPU, in float32 (the reference engine stays
    exact), or for a weight format the kernels do not decode."""
    if not x.is_cuda or x.dtype == torch.float32:
        return None
    from strata.kernels.moe.decode import SPECS
    from strata.quant import get_format

    from strata.kernels.moe.stack import dot_length_fits, gemv_length_fits

    matrices = (stack.gate, stack.up, stack.down)
    formats = [get_format(w.ggml_type).name for w in matrices]
    if not all(f in SPECS for f in formats):
        return None
    if x.shape[0] >= PROMPT_KERNEL_MIN_TOKENS:
        # The grouped GEMMs step 64 values at a time: small models (an expert of 32 hidden units) keep the loop.
        return "prompt" if all(dot_length_fits(SPECS[f], w.shape[-1]) for f, w in zip(formats, matrices)) else None
    if not all(gemv_length_fits(SPECS[f], w.shape[-1]) for f, w in zip(formats, matrices)):
        return None
    return "decode" if formats[0] == formats[1] else None


def run_kernels(path: str, stack: ExpertStack, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    if path == "prompt":
        from strata.kernels.moe import moe_prefill

        return moe_prefill(x, ids.to(torch.int32), weights.float(), stack)
    from strata.kernels.moe.gemv import DecodeExperts, moe_gemv

    return moe_gemv(x, ids.to(torch.int32), weights.float(), DecodeExperts.of_stack(stack))


class ResidentExperts(ExpertBackend):
    """Every expert lives on the compute device in its quant format. On the GPU, prompt chunks and decode steps go
    through the Triton expert kernels; otherwise each used expert is dequantized on use."""

    name = "resident"

    def __init__(self, stacks: dict[int, ExpertStack]):
        self.stacks = stacks

    def start(self, layer, x, weights, ids):
        stack = self.stacks[layer]
        path = kernel_path(stack, x)
        if path is not None:
            return PendingExperts(run_kernels(path, stack, x, weights, ids))
        routes = routed_tokens(ids)
        out = torch.zeros_like(x)
        accumulate(out, routes, weights, x, stack.expert, routes)
        return PendingExperts(out)


@dataclass
class StepPlan:
    """Where a routed layer's experts run this step: the routing ids [T, k] (host), the cached experts
    (expert -> slot) and their table (int32 [n_experts], -1 where not cached; on the host)."""

    ids: torch.Tensor
    hits: dict[int, int]
    table: torch.Tensor

    @cached_property
    def routes(self) -> dict:
        """{expert: (token rows, top-k slot)}, made only where a reference path asks (not per captured step)."""
        return routed_tokens(self.ids)


def hits_table(n_experts: int, hits: dict[int, int]) -> torch.Tensor:
    table = np.full(n_experts, -1, np.int32)  # numpy: a few us a layer where torch's indexing took ~11
    if hits:
        table[list(hits)] = list(hits.values())
    return torch.from_numpy(table)


MISS_PATHS = ("auto", "cpu", "direct")


def miss_path(option: str, device: torch.device, host_stacks: dict) -> str:
    """`--misses auto`: direct on a GPU whose host experts are pinned (measured on the H200 host, A3B shape at 12 GiB:
    107 tok/s against the CPU pool's 90, which pays a host round trip per layer), else the CPU pool."""
    if option not in MISS_PATHS:
        raise StrataError(f"--misses must be one of {', '.join(MISS_PATHS)}, got {option!r}")
    if option != "auto":
        return option
    pinned = all(s.gate.raw.is_pinned() for s in host_stacks.values())
    return "direct" if torch.device(device).type == "cuda" and pinned else "cpu"


class CachedExperts(ExpertBackend):
    """Experts live in host RAM; a GPU cache holds some. Hits run on the device; misses run on the CPU pool, or
    (a `pcie_frac` share of them) are copied over PCIe and run on the device, or (`misses="direct"`, decode steps)
    are read by the device's kernels straight from pinned host RAM (engine/direct_misses.py). Prompt chunks may go
    to `prompt`, which streams every missing expert to the device instead."""

    name = "cached"

    def __init__(self, host_stacks: dict[int, ExpertStack], cache, pool, device: torch.device, pcie_frac: float = 0.0,
                 prompt=None, misses: str = "auto"):
        self.host_stacks, self.cache, self.pool = host_stacks, cache, pool
        self.device, self.pcie_frac = torch.device(device), pcie_frac
        self.pcie_bytes = 0
        self.prompt = prompt  # a PromptStreamer (engine/prefill_stream.py) for prompt chunks, or None
        self.direct = miss_path(misses, self.device, host_stacks) == "direct"
        if self.direct:
            if self.device.type == "cuda" and not all(s.gate.raw.is_pinned() for s in host_stacks.values()):
                raise StrataError("--misses direct reads experts from pinned host RAM: drop --no-pin-experts")
            cache.track_on_device()

    def takes_direct(self, x: torch.Tensor) -> bool:
        """Whether this step's misses are read by the device itself: a decode step (the GEMV kernels' path on a
        GPU; any small step on the CPU, whose reference loop reads the same bytes)."""
        if not self.direct:
            return False
        path = kernel_path(next(iter(self.host_stacks.values())), x)
        return path == "decode" or (x.device.type == "cpu" and x.shape[0] < PROMPT_KERNEL_MIN_TOKENS)

    def start(self, layer, x, weights, ids):
        if self.prompt is not None:
            # A verify window's rows are decode steps (issue 10): never streamed as a prompt chunk of as many rows.
            if self.prompt.takes(x) and not in_window():
                return PendingExperts(self.prompt.run(layer, x, weights, ids))
            self.prompt.return_slots()  # a decode step: the cache gets its lent slots back first
        if self.takes_direct(x):
            from strata.engine.direct_misses import direct_part

            return PendingExperts(direct_part(self, layer, x, weights, ids))
        routes = routed_tokens(ids)
        experts = list(routes)
        hits, misses = self.cache.lookup(layer, experts)
        n_pcie = round(len(misses) * self.pcie_frac)
        over_pcie, on_cpu = misses[:n_pcie], misses[n_pcie:]
        future = None
        if on_cpu:
            future = self.pool.submit(layer, x.float().cpu(), None, weights.float().cpu(), on_cpu, ids=ids.cpu())
        out = torch.zeros_like(x)
        if hits and kernel_path(self.host_stacks[layer], x) == "decode":
            out += self.hits_by_kernel(layer, x, weights, ids, hits)
        elif hits:
            accumulate(out, routes, weights, x, lambda e: self.cache.expert_weights(layer, hits[e]), hits)
        if over_pcie:
            stack = self.host_stacks[layer]
            self.pcie_bytes += len(over_pcie) * stack.expert_bytes
            accumulate(out, routes, weights, x,
                       lambda e: tuple(w.to(self.device) for w in stack.expert(e)), over_pcie)
        if future is None:
            return PendingExperts(out)
        return PendingExperts(out, lambda out: out + future.result().to(out.device, out.dtype))

    def hits_by_kernel(self, layer, x, weights, ids, hits: dict[int, int]) -> torch.Tensor:
        """The cached experts' share in one GEMV launch over the slots: a table maps expert -> slot, and the
        kernel adds nothing for the experts it marks -1 (the misses, computed elsewhere)."""
        table = hits_table(self.host_stacks[layer].n_experts, hits)
        return self._slot_gemv(layer, x, weights, ids, table.to(x.device, non_blocking=True))

    def _slot_gemv(self, layer, x, weights, ids, table: torch.Tensor) -> torch.Tensor:
        from strata.kernels.moe.gemv import DecodeExperts, moe_gemv

        experts = DecodeExperts.of_slots(self.cache.slots, table, self.host_stacks[layer])
        return moe_gemv(x, ids.to(torch.int32), weights.float(), experts)

    # ---- the same work in the pieces a captured decode step (engine/decode.py) runs between its graphs

    def plan_step(self, layer, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                  out: torch.Tensor | None = None):
        """Host side of a routed layer, from its published (host) x, weights and ids: look the experts up, hand
        the misses to the CPU pool (its result into `out`, when given). Returns (the pool's future or None, the
        StepPlan of the device's share)."""
        experts = np.unique(ids.numpy()).tolist()  # sorted, as routed_tokens; no torch ops on this per-layer path
        hits, misses = self.cache.lookup(layer, experts)
        future = self.pool.submit(layer, x, None, weights, misses, ids=ids, out=out) if misses else None
        return future, StepPlan(ids, hits, hits_table(self.host_stacks[layer].n_experts, hits))

    def hits_part(self, layer, x, weights, ids, plan: "StepPlan | None", table: torch.Tensor) -> torch.Tensor:
        """The cached experts' share: one GEMV over the slots through the device `table` (static, so it captures;
        nothing for the -1 entries), or where the kernels do not run, the reference loop over `plan.hits`."""
        out = torch.zeros_like(x)
        if kernel_path(self.host_stacks[layer], x) == "decode":
            out += self._slot_gemv(layer, x, weights, ids, table)
        elif plan is not None and plan.hits:
            hits = plan.hits
            accumulate(out, plan.routes, weights, x, lambda e: self.cache.expert_weights(layer, hits[e]), hits)
        return out

    def end_step(self) -> None:
        self.cache.end_step()
