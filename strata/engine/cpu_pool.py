"""The CPU expert pool: computes the experts the GPU cache lacks, on the host, while the GPU works on the rest."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from strata.engine.cpu_kernels import HostExperts, moe_experts
from strata.engine.experts import ExpertStack


@dataclass
class PoolStats:
    experts: int = 0
    bytes: int = 0  # expert weight bytes read
    seconds: float = 0.0

    @property
    def gb_per_second(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds else float("nan")


class CPUExpertPool:
    """One worker thread hands each layer's missed experts to the block kernels of `strata.engine.cpu_kernels` in
    one call; numba's threads (one per core) split the weight rows, with the GIL released.

    The weights are read in their GGUF bytes (Q8_0, Q4_0, Q4_K, Q6_K, Q2_0; other formats are dequantized with
    torch), the activations as int16 per block group: within ~2e-5 of float64 on a typical output.
    """

    def __init__(self, stacks: dict[int, ExpertStack]):
        self.stacks = stacks
        self.host = {layer: HostExperts(s.gate, s.up, s.down) for layer, s in stacks.items()}
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="strata-cpu-experts")
        self.stats = PoolStats()

    def compute(self, layer: int, x: torch.Tensor, routes: dict, weights: torch.Tensor, experts: list[int]) -> torch.Tensor:
        start = time.perf_counter()
        out = moe_experts(self.host[layer], x, routes, weights, experts)
        self.stats.experts += len(experts)
        self.stats.bytes += len(experts) * self.stacks[layer].expert_bytes
        self.stats.seconds += time.perf_counter() - start
        return out

    def submit(self, layer: int, x: torch.Tensor, routes: dict, weights: torch.Tensor, experts: list[int]) -> Future:
        """x, routes and weights already on the host; the result is float32 [T, embd] on the host."""
        return self.executor.submit(self.compute, layer, x, routes, weights, experts)

    def close(self) -> None:
        self.executor.shutdown(wait=True)
