"""How activations cross from one pipeline stage (card) to the next: one small interface, so that a torch.distributed
pipeline across processes can replace the in-process form without touching the model code.

In one process, each CUDA stage runs on a stream of its own; a send records an event on the sender's stream, the
receiver's stream waits for it and copies (peer to peer where the cards can reach each other, else through pinned
host memory). On the CPU the same calls run in order and a send between CPU stages is a copy.
"""

from __future__ import annotations

import contextlib
import threading
from abc import ABC, abstractmethod

import torch


class Transport(ABC):
    """Moves a stage's outputs to the next stage; `stage_context(i)` wraps the work of stage i."""

    @abstractmethod
    def send(self, stage: int, tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """The tensors stage `stage` produced, as stage `stage + 1` sees them (on its device, ordered after them)."""

    def send_into(self, stage: int, source: torch.Tensor, target: torch.Tensor) -> None:
        """Captured decode (engine/decode_split.py): stage `stage`'s static buffer `source` copied into stage
        `stage + 1`'s `target`, ordered after the sender's work and before the receiver's."""
        (moved,) = self.send(stage, (source,))
        target.copy_(moved)

    def stage_context(self, stage: int):
        return contextlib.nullcontext()

    def begin(self) -> None:
        """Before a run: stages wait for what the caller queued (inputs, cache growth)."""

    def finish(self, tensor: torch.Tensor) -> torch.Tensor:
        """The last stage's result, on the first stage's device and ordered for the caller's stream there."""
        return tensor


class InProcessTransport(Transport):
    def __init__(self, devices: tuple[torch.device, ...]):
        self.devices = tuple(torch.device(d) for d in devices)
        self.streams = [torch.cuda.Stream(d) if d.type == "cuda" else None for d in self.devices]  # all or none
        # Peer copies where both cards can reach each other; otherwise through pinned host memory.
        self.peer = [self._can_peer(a, b) for a, b in zip(self.devices, self.devices[1:])]
        self.sends = 0
        self.bytes_sent = 0
        self._count = threading.Lock()  # stages may send from threads of their own
        self._staging: dict = {}  # boundary -> (pinned buffer, event after its last read) for send_into

    @staticmethod
    def _can_peer(a: torch.device, b: torch.device) -> bool:
        if a.type != "cuda" or b.type != "cuda":
            return False
        return a.index == b.index or torch.cuda.can_device_access_peer(a.index, b.index)

    def stage_context(self, stage: int):
        stream = self.streams[stage]
        if stream is None:
            return contextlib.nullcontext()
        context = contextlib.ExitStack()
        context.enter_context(torch.cuda.device(self.devices[stage]))  # Triton launches on the current device
        context.enter_context(torch.cuda.stream(stream))
        return context

    def begin(self) -> None:
        for device, stream in zip(self.devices, self.streams):
            if stream is not None:
                stream.wait_stream(torch.cuda.current_stream(device))

    def send(self, stage: int, tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        with self._count:
            self.sends += 1
            self.bytes_sent += sum(t.numel() * t.element_size() for t in tensors)
        return tuple(self._move(t, stage, stage + 1) for t in tensors)

    def send_into(self, stage: int, source: torch.Tensor, target: torch.Tensor) -> None:
        with self._count:
            self.sends += 1
            self.bytes_sent += source.numel() * source.element_size()
        src_stream, dst_stream = self.streams[stage], self.streams[stage + 1]
        if dst_stream is None:
            target.copy_(source)
            return
        dst_stream.wait_event(src_stream.record_event())
        if self.peer[stage]:
            # Across cards torch copies on the source card's current stream (here the sender's, after its graphs)
            # and makes the target card's current stream (the receiver's) wait; on one card, on the receiver's.
            with torch.cuda.stream(src_stream), torch.cuda.stream(dst_stream):
                target.copy_(source, non_blocking=True)
            return
        # Through pinned host memory kept per boundary: out on the sender's stream, in on the receiver's. The sender
        # waits for the receiver's last read of the staging buffer before overwriting it.
        staged, read = self._staging.get(stage, (None, None))
        if staged is None or staged.shape != source.shape or staged.dtype != source.dtype:
            staged = torch.empty(source.shape, dtype=source.dtype, pin_memory=True)
        if read is not None:
            src_stream.wait_event(read)
        with torch.cuda.stream(src_stream):
            staged.copy_(source, non_blocking=True)
        dst_stream.wait_event(src_stream.record_event())
        with torch.cuda.stream(dst_stream):
            target.copy_(staged, non_blocking=True)
        self._staging[stage] = (staged, dst_stream.record_event())

    def _move(self, tensor: torch.Tensor, source: int, target: int) -> torch.Tensor:
        src_stream, dst_stream = self.streams[source], self.streams[target]
        device = self.devices[target]
        if dst_stream is None:
            return tensor.to(device, copy=True)  # CPU stages: a copy, as a real hop would make
        dst_stream.wait_stream(torch.cuda.current_stream(device))  # what the sender queued on the receiver's card
        ready = src_stream.record_event()
        dst_stream.wait_event(ready)
        if self.peer[source]:
            # Between two cards torch runs the copy on the source card's current stream: it waits for the sender too.
            copier = dst_stream if tensor.device == device else torch.cuda.current_stream(tensor.device)
            copier.wait_event(ready)
            with torch.cuda.stream(dst_stream):
                out = torch.empty_like(tensor, device=device)
                out.copy_(tensor, non_blocking=True)
            tensor.record_stream(copier)  # the sender's memory is not reused before the copy has read it
            return out
        # Through pinned host memory: the sender's stream copies out, the receiver's stream copies in after it.
        staged = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        with torch.cuda.stream(src_stream):
            staged.copy_(tensor, non_blocking=True)
        dst_stream.wait_event(src_stream.record_event())
        with torch.cuda.stream(dst_stream):
            return staged.to(device, non_blocking=True)

    def finish(self, tensor: torch.Tensor) -> torch.Tensor:
        last, first = len(self.devices) - 1, self.devices[0]
        out = tensor if tensor.device == first else self._move_to_first(tensor, last)
        for stream in self.streams:
            if stream is None:
                continue
            # The caller's stream on every card sees every stage's work (and a sync of the first card waits for it).
            for device in {stream.device, first}:
                torch.cuda.current_stream(device).wait_stream(stream)
        return out

    def _move_to_first(self, tensor: torch.Tensor, last: int) -> torch.Tensor:
        stream = self.streams[last]
        if stream is None:
            return tensor.to(self.devices[0])
        with torch.cuda.stream(stream):  # logits: a plain copy, ordered after the last stage's work
            return tensor.to(self.devices[0])
