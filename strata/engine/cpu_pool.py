"""The CPU expert pool: computes the experts the GPU cache lacks, on the host, while the GPU works on the rest."""

from __future__ import annotations

import itertools
import time
from concurrent.futures import Future
from dataclasses import dataclass

import numba
import numpy as np
import torch

from strata.engine.cpu_kernels import HostExperts, moe_experts
from strata.engine.cpu_kernels.done_flag import wait_flag
from strata.engine.cpu_kernels.layer_call import LayerBuffers
from strata.engine.experts import ExpertStack, routed_tokens
from strata.engine.pool_worker import SpinningWorker
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


# Between two calls the pool's threads stay awake this long (microseconds): past the ~0.1-1 ms between the layers
# of one decode step that miss experts, short of the time between tokens of an idle server.
DEFAULT_SPIN_US = 1000.0
WAIT_SPINS = 1 << 20  # pause-paced reads of the done flag (~10-100 ms) before `result` blocks on the future instead


@dataclass
class PoolStats:
    calls: int = 0
    experts: int = 0
    bytes: int = 0  # expert weight bytes read
    seconds: float = 0.0

    @property
    def gb_per_second(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds else float("nan")


class CPUExpertPool:
    """One worker thread computes each layer's missed experts in one native call (`cpu_kernels.layer_call`: pairs,
    activation codes, gate/up + SwiGLU, down and the weighted sum, with buffers kept from call to call); `threads`
    numba threads split chunks of output rows over every expert of the call, so one expert still takes them all.

    The weights are read in their GGUF bytes (Q8_0, Q4_0, Q4_K, Q6_K, Q2_0; other formats, or STRATA_CPU_POOL_OLD,
    take `moe_experts`'s other paths), the activations as int16 per group: within ~2e-5 of float64 on a typical output.
    """

    def __init__(self, stacks: dict[int, ExpertStack], threads: int = 0, spin_us: float = DEFAULT_SPIN_US):
        self.stacks = stacks
        self.host = {layer: HostExperts(s.gate, s.up, s.down) for layer, s in stacks.items()}
        self.threads = pool_threads(threads)
        if spin_us < 0:
            raise StrataError(f"cpu_spin_us must be >= 0 (0: the pool's threads sleep between calls), got {spin_us}")
        self.spin_us = spin_us
        self.buffers: dict[tuple, LayerBuffers] = {}  # by shape: touched by the worker thread only
        # The worker and numba's threads start now, not in the first step; between calls they spin for spin_us.
        self.worker = SpinningWorker(self.threads, spin_us, lambda: worker_setup(self.threads))
        self.stats = PoolStats()
        self.done = np.zeros(1, np.int64)  # the number of the last SIMD call whose output is complete
        self._numbers = itertools.count(1)

    def _buffers(self, host: HostExperts) -> LayerBuffers:
        gate, _, down = host.mats
        key = (host.types, gate.shape[-1], gate.shape[1], host.simd)
        if key not in self.buffers:
            self.buffers[key] = LayerBuffers(host.types, gate.shape[-1], gate.shape[1], host.simd)
        return self.buffers[key]

    def compute(self, layer: int, x: torch.Tensor, routes: dict, weights: torch.Tensor, experts: list[int],
                ids: torch.Tensor | None = None, out: torch.Tensor | None = None, number: int = 0) -> torch.Tensor:
        start = time.perf_counter()
        host = self.host[layer]
        self.stats.calls += 1  # counted before the result is out (a `result` waiter may read them at once)
        self.stats.experts += len(experts)
        self.stats.bytes += len(experts) * self.stacks[layer].expert_bytes
        if host.simd:
            out = self.layer_call(host, x, routes, weights, experts, ids, out, number)
        else:
            result = moe_experts(host, x, routed_tokens(ids) if routes is None else routes, weights, experts)
            out = result if out is None else out.copy_(result)
        self.stats.seconds += time.perf_counter() - start
        return out

    def layer_call(self, host: HostExperts, x: torch.Tensor, routes: dict, weights: torch.Tensor, experts: list[int],
                   ids: torch.Tensor | None, out: torch.Tensor | None = None, number: int = 0) -> torch.Tensor:
        """The SIMD layers: numpy views of the (host) inputs, then one native call. Without `ids`, the routes are
        written back into an ids array (-1 elsewhere) that gives the same pairs."""
        x_np = np.ascontiguousarray(x.numpy(), dtype=np.float32) if x.dtype == torch.float32 else x.float().numpy()
        w_np = np.ascontiguousarray(weights.float().numpy())
        if ids is None:
            ids_np = np.full(w_np.shape, -1, np.int64)
            for e in experts:
                token, slot = routes[e]
                ids_np[token.numpy(), slot.numpy()] = e
        else:
            ids_np = np.ascontiguousarray(ids.numpy(), dtype=np.int64)
        if out is None:
            out = torch.empty(x_np.shape, dtype=torch.float32)
        self._buffers(host).run(host.views, x_np, ids_np, w_np, np.asarray(experts, np.int64), out.numpy(),
                                self.done if number else None, number)
        return out

    def submit(self, layer: int, x: torch.Tensor, routes: dict, weights: torch.Tensor, experts: list[int],
               ids: torch.Tensor | None = None, out: torch.Tensor | None = None) -> Future:
        """x, weights and the routing, as routes {expert: (token rows, top-k slot)} or as ids [T, k] (routes None),
        already on the host; the result is float32 [T, embd] on the host: in `out` when given (a contiguous float32
        host tensor, e.g. pinned for an asynchronous upload), else a new tensor."""
        number = next(self._numbers) if out is not None and self.host[layer].simd else 0
        future = self.worker.submit(self.compute, layer, x, routes, weights, experts, ids, out, number)
        future.strata_call = (number, out)
        return future

    def result(self, future: Future) -> torch.Tensor:
        """`future.result()`, sooner: for a SIMD call into a given `out`, spin (GIL released) until the native call
        has stored its number in the done flag, not waiting for the worker's wake-up of this thread."""
        number, out = getattr(future, "strata_call", (0, None))
        if number and wait_flag(self.done.ctypes.data, number, WAIT_SPINS):
            return out
        return future.result()

    def close(self) -> None:
        self.worker.shutdown()
