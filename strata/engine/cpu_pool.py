"""The CPU expert pool: computes the experts the GPU cache lacks, on the host, while the GPU works on the rest."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from strata.engine.experts import ExpertStack, accumulate


@dataclass
class PoolStats:
    experts: int = 0
    bytes: int = 0  # expert weight bytes read
    seconds: float = 0.0

    @property
    def gb_per_second(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds else float("nan")


class CPUExpertPool:
    """One worker thread; torch's own threads do the arithmetic (its kernels release the GIL).

    Today each expert is dequantized with torch and multiplied in float32: correct, and the baseline the
    compiled block kernels (ggml's CPU backend, numba for Q2_0) will replace.
    """

    def __init__(self, stacks: dict[int, ExpertStack]):
        self.stacks = stacks
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="strata-cpu-experts")
        self.stats = PoolStats()

    def compute(self, layer: int, x: torch.Tensor, routes: dict, weights: torch.Tensor, experts: list[int]) -> torch.Tensor:
        start = time.perf_counter()
        stack = self.stacks[layer]
        out = torch.zeros_like(x)
        accumulate(out, routes, weights, x, stack.expert, experts)
        self.stats.experts += len(experts)
        self.stats.bytes += len(experts) * stack.expert_bytes
        self.stats.seconds += time.perf_counter() - start
        return out

    def submit(self, layer: int, x: torch.Tensor, routes: dict, weights: torch.Tensor, experts: list[int]) -> Future:
        """x, routes and weights already on the host; the result is float32 [T, embd] on the host."""
        return self.executor.submit(self.compute, layer, x, routes, weights, experts)

    def close(self) -> None:
        self.executor.shutdown(wait=True)
