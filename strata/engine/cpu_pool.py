"""The CPU expert pool: computes the experts the GPU cache lacks, on the host, while the GPU works on the rest."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numba
import torch

from strata.engine.cpu_kernels import HostExperts, moe_experts
from strata.engine.experts import ExpertStack
from strata.errors import StrataError


def pool_threads(asked: int = 0) -> int:
    """numba threads for the pool: `asked`, or by default every core but one, which the decode thread (spinning on
    the GPU, launching graphs) keeps; a parallel region that waits on a descheduled worker stalls a whole tick."""
    cores = numba.config.NUMBA_NUM_THREADS
    if asked < 0 or asked > cores:
        raise StrataError(f"cpu_threads must be in 0..{cores} (0: {max(1, cores - 1)}, every core but one), got {asked}")
    return asked or max(1, cores - 1)


def worker_setup(threads: int, chunksize: int = 0) -> None:
    """Both settings are per calling thread in numba: they hold for the kernels this worker runs. chunksize 0 is
    numba's static split of the work items over the threads; n > 0 hands them out n at a time (dynamic)."""
    numba.set_num_threads(threads)
    numba.set_parallel_chunksize(chunksize)


@dataclass
class PoolStats:
    experts: int = 0
    bytes: int = 0  # expert weight bytes read
    seconds: float = 0.0

    @property
    def gb_per_second(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds else float("nan")


class CPUExpertPool:
    """One worker thread hands each layer's missed experts to the SIMD kernels of `strata.engine.cpu_kernels` in
    one call; `threads` numba threads split chunks of output rows over all of them, with the GIL released.

    The weights are read in their GGUF bytes (Q8_0, Q4_0, Q4_K, Q6_K, Q2_0; other formats are dequantized with
    torch), the activations as int16 per group: within ~2e-5 of float64 on a typical output.
    """

    def __init__(self, stacks: dict[int, ExpertStack], threads: int = 0):
        self.stacks = stacks
        self.host = {layer: HostExperts(s.gate, s.up, s.down) for layer, s in stacks.items()}
        self.threads = pool_threads(threads)
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="strata-cpu-experts", initializer=worker_setup,
                                           initargs=(self.threads,))
        self.executor.submit(int).result()  # the worker and numba's threads start now, not in the first step
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
