"""Typed work buffers cut from one flat byte range: a prompt chunk's expert scratch living in expert-cache slots
the chunk borrowed (a contiguous run of slots is one byte range of the cache's uint8 slot tensor).

Bump allocation: each buffer starts on an ALIGN-byte address (any dtype's alignment, and the kernels' vector loads);
`reset` before each layer reuses the range (work on one stream runs in order, so a layer's kernels are done with
their buffers before the next layer's kernels overwrite them). A request past the end is served by the allocator
and counted in `overflow_bytes`: the chunk-size rule should make that never happen, and tests assert it.
"""

from __future__ import annotations

import math

import torch

ALIGN = 256


def aligned_bytes(shapes_and_dtypes) -> int:
    """Bytes an arena needs for these (shape, dtype) requests in one go, the worst-case alignment included."""
    total = ALIGN  # the range itself may start anywhere
    for shape, dtype in shapes_and_dtypes:
        n = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
        total += -(-n // ALIGN) * ALIGN
    return total


class WorkArena:
    def __init__(self, memory: torch.Tensor):
        if memory.dtype != torch.uint8 or memory.dim() != 1 or not memory.is_contiguous():
            raise ValueError("a work arena needs a flat contiguous uint8 tensor")
        self.memory = memory
        self.used = 0
        self.high_water = 0
        self.overflow_bytes = 0

    @property
    def n_bytes(self) -> int:
        return self.memory.numel()

    def reset(self) -> None:
        self.used = 0

    def owns(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor`'s bytes lie inside the arena's range."""
        begin, end = self.memory.data_ptr(), self.memory.data_ptr() + self.n_bytes
        n = tensor.numel() * tensor.element_size()
        return tensor.device == self.memory.device and begin <= tensor.data_ptr() and tensor.data_ptr() + n <= end

    def empty(self, shape, dtype: torch.dtype) -> torch.Tensor:
        shape = tuple(shape)
        n = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
        base = self.memory.data_ptr()
        start = self.used + (-(base + self.used)) % ALIGN
        if start + n > self.n_bytes:
            self.overflow_bytes += n
            return torch.empty(shape, dtype=dtype, device=self.memory.device)
        self.used = start + n
        self.high_water = max(self.high_water, self.used)
        return self.memory[start : start + n].view(dtype).view(shape)

    def zeros(self, shape, dtype: torch.dtype) -> torch.Tensor:
        return self.empty(shape, dtype).zero_()


class AllocatorScratch:
    """The same interface over PyTorch's allocator: what runs when no slots are borrowed."""

    def __init__(self, device: torch.device):
        self.device = device

    def reset(self) -> None:
        pass

    def empty(self, shape, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(tuple(shape), dtype=dtype, device=self.device)

    def zeros(self, shape, dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(tuple(shape), dtype=dtype, device=self.device)
