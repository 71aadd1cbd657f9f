"""The device's own ceilings, measured in the same run as the figure they bound. Kept free of the engine's imports
so the kernels' benches run where the engine's dependencies are absent."""

from __future__ import annotations

import time

import torch


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU), so wall-clock times mean something."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


class Timer:
    """Milliseconds per call of a function: CUDA events on the GPU, the wall clock on the CPU."""

    def __init__(self, device: torch.device):
        self.cuda = torch.device(device).type == "cuda"

    def __call__(self, fn, reps: int) -> float:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(reps):
                fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / reps
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) * 1e3 / reps


def graph_us(fn, calls: list, device) -> float:
    """Microseconds per call of fn(*args) over a CUDA graph replaying every call in `calls` (on the CPU: the first
    call, timed once)."""
    if torch.device(device).type != "cuda":
        return Timer(device)(lambda: fn(*calls[0]), 1) * 1e3
    fn(*calls[0])
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for args in calls:
            fn(*args)
    ms = min(Timer(device)(graph.replay, 5) for _ in range(3))
    return ms * 1e3 / len(calls)


def copy_bandwidth(device: torch.device, n_bytes: int = 1 << 30) -> float:
    """Bytes/s of a large device-to-device copy, counting read + write (a quarter the size on the CPU)."""
    device = torch.device(device)
    src = torch.empty(n_bytes if device.type == "cuda" else n_bytes >> 2, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    timer = Timer(device)
    ms = min(timer(lambda: dst.copy_(src), 5) for _ in range(3))
    return 2 * src.numel() / (ms * 1e-3)


def read_bandwidth(device: torch.device, n_bytes: int = 1 << 30) -> float:
    """Bytes/s a kernel that only reads can stream, for the floors of read-bound work (decode's weights, the expert
    GEMVs): the copy's whole traffic, its reads and its writes. Memory serves both from one budget, so a stream of
    reads alone runs at the copy's total rate, not half of it (halving it, as these floors did before session 5,
    made them twice as easy to reach)."""
    return copy_bandwidth(device, n_bytes)


def host_to_device_bandwidth(device: torch.device, n_bytes: int = 256 << 20) -> float:
    """Bytes/s of pinned host-to-device copies: the PCIe ceiling for streamed experts."""
    src = torch.empty(n_bytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(n_bytes, dtype=torch.uint8, device=device)
    ms = min(Timer(device)(lambda: dst.copy_(src, non_blocking=True), 3) for _ in range(3))
    return n_bytes / (ms * 1e-3)
