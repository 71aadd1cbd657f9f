"""Host-to-device copies on a side stream, ordered by events: the seam between the streaming logic and CUDA.

On a GPU the copies run on a CUDA stream and the events are CUDA events. On the CPU the same calls are made: the
copies happen at once and the events are markers with nothing to wait for, so CPU tests run the GPU's code path.
"""

from __future__ import annotations

import itertools

import torch


class Marker:
    """The CPU's event: work is done when it is recorded; `n` orders markers for tests that trace them."""

    _count = itertools.count()

    def __init__(self):
        self.n = next(Marker._count)

    def __repr__(self) -> str:
        return f"Marker({self.n})"


class CopyQueue:
    def __init__(self, device: torch.device, stream: "torch.cuda.Stream | None" = None):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        if self.cuda and stream is None:
            stream = torch.cuda.Stream(self.device)
        self.stream = stream if self.cuda else None
        self.bytes = 0  # copied so far

    def mark(self):
        """An event recorded on the compute stream: everything launched so far has finished when it fires."""
        if not self.cuda:
            return Marker()
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event

    def copy(self, dst: torch.Tensor, parts: list[torch.Tensor], after=None):
        """Copy the host tensors `parts` back to back into the flat uint8 `dst`, once `after` (an event or None) has
        fired; returns the event that fires when the bytes have landed."""
        offset = 0
        if not self.cuda:
            for p in parts:
                dst[offset : offset + p.numel()].copy_(p.reshape(-1))
                offset += p.numel()
            self.bytes += offset
            return Marker()
        if after is not None:
            self.stream.wait_event(after)
        with torch.cuda.stream(self.stream):
            for p in parts:
                dst[offset : offset + p.numel()].copy_(p.reshape(-1), non_blocking=True)
                offset += p.numel()
            landed = torch.cuda.Event()
            landed.record(self.stream)
        self.bytes += offset
        return landed

    def drain(self) -> None:
        """Make the compute stream wait for every copy queued so far (before it writes memory they may write)."""
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_stream(self.stream)

    def wait(self, event) -> None:
        """Make the compute stream wait for `event` (kernels launched after this see the copy's bytes)."""
        if self.cuda and event is not None:
            torch.cuda.current_stream(self.device).wait_event(event)
