"""Host-to-device copies on a side stream, ordered by events: the seam between the streaming logic and CUDA.

On a GPU the copies run on a CUDA stream and the events are CUDA events. On the CPU the same calls are made: the
copies happen at once and the events are markers with nothing to wait for, so CPU tests run the GPU's code path.

A batch of experts goes to the device in one launch (`gather`: kernels/moe/expert_gather.py reads the pinned host
stacks itself), whatever its size: the host's cost a layer is flat. Memory-mapped stacks (`--no-pin-experts`), or
STRATA_PF_STREAM_COPIES=1 for before/after runs, take the previous form: three copies an expert.

STRATA_PF_STREAM=dma: the batch goes through the copy engines instead (engine/copy_runs.py groups it into runs of
experts consecutive in the host stacks and in the slots, three strided copies a run, engine/dma_copy.py queues them
with cudaMemcpy2DAsync): no SM taken from the layer computing beside it. A batch scattered in the host stacks (a
prompt's lent slots refilled at its end) takes the kernel whatever the form (`gather(kernel=True)`). `dma1d`: one
copy an expert part (the same bytes; for comparison). `gather-hi`: the gather kernel on a copy stream of the highest
priority torch allows.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from strata import switches
from strata.engine.copy_runs import group_runs, plan_copies
from strata.engine.dma_copy import copy_engine, run_plan
from strata.engine.staging import upload
from strata.errors import StrataError
from strata.kernels.moe.expert_gather import (GatherConfig, GatherOperands, gather_experts_ref, gather_experts_triton,
                                              gather_pairs, part_bytes)


STREAM_FORMS = ("gather", "gather-hi", "dma", "dma1d")
COPY_STREAM_PRIORITY = -1  # the cache's copy stream: gather kernels take SMs as the layer beside them frees them
HIGHEST_PRIORITY = -3  # torch keeps four stream priorities, 0 to -3


def stream_form() -> str:
    """STRATA_PF_STREAM: how a batch of streamed experts reaches the device."""
    form = switches.get("STRATA_PF_STREAM").strip().lower() or "dma"
    if form not in STREAM_FORMS:
        raise StrataError(f"STRATA_PF_STREAM={form!r}: use one of {', '.join(STREAM_FORMS)}")
    return form


def copy_stream_priority() -> int:
    """The priority of the expert cache's copy stream (where streamed batches are queued)."""
    return HIGHEST_PRIORITY if stream_form() == "gather-hi" else COPY_STREAM_PRIORITY


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
        self.launches = 0  # gathers queued (one a batch; tests check the host's work is flat)
        self.per_part = switches.get("STRATA_PF_STREAM_COPIES")
        self.form = stream_form()
        self.copies = 0  # copy calls queued by the dma forms (tests and benches: the host's work a batch)
        self.copied_by = ""  # which form ran the last dma batch (the runtime's function, or torch)
        config = switches.get("STRATA_PF_GATHER")
        self.config = GatherConfig.parse(config) if config else GatherConfig()
        self._pinned: dict[int, bool] = {}  # id(stack) -> whether the kernel may read it (pinned host memory)
        self._operands: dict[tuple, GatherOperands] = {}  # (id(stack), slots' address, shape) -> the launch's
        self.timed = False  # profiles: time each batch on the copy stream (`gather_ms`)
        self._timings: list = []

    def mark(self):
        """An event recorded on the compute stream: everything launched so far has finished when it fires."""
        if not self.cuda:
            return Marker()
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event

    def gather(self, slots: torch.Tensor, stack, experts: np.ndarray, targets: np.ndarray, after=(),
               kernel: bool = False):
        """Copy each experts[i]'s bytes (gate, up, down back to back) into slot targets[i] of `slots`, once every
        event in `after` has fired; returns the event that fires when all of them have landed. `kernel`: the gather
        kernel whatever the form (a batch scattered over the host stacks, a prompt's lent slots refilled at its end,
        would be thousands of copy-engine calls of ~10 us of host time each)."""
        self.launches += 1
        self.bytes += len(experts) * stack.expert_bytes
        dma = self.dma and not kernel
        if not self.cuda:
            if dma and not self.per_part:  # the plan the GPU's copy engines get, run by torch
                self.copy_runs(slots, stack, experts, targets)
            else:
                gather_experts_ref(slots, stack, torch.from_numpy(experts), torch.from_numpy(targets))
            return Marker()
        for event in after:
            if event is not None:
                self.stream.wait_event(event)
        with torch.cuda.stream(self.stream):
            if self.timed:
                self._timings.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
                self._timings[-1][0].record(self.stream)
            if self._kernel_reads(stack):
                if dma:
                    self.copy_runs(slots, stack, experts, targets)
                else:
                    self.launch(slots, stack, experts, targets)
            else:
                self._copy_parts(slots, stack, experts, targets)
            if self.timed:
                self._timings[-1][1].record(self.stream)
            landed = torch.cuda.Event()
            landed.record(self.stream)
        return landed

    def gather_ms(self) -> float:
        """Milliseconds the copy stream spent in the batches timed since the last call (waits for them)."""
        total = 0.0
        for start, end in self._timings:
            end.synchronize()
            total += start.elapsed_time(end)
        self._timings = []
        return total

    def launch(self, slots, stack, experts: np.ndarray, targets: np.ndarray) -> None:
        """The kernel's launch on the current stream: the (expert, slot) list uploaded without a host wait (on the
        CPU, under TRITON_INTERPRET=1, the tests run it as it is)."""
        pairs = upload(gather_pairs(experts, targets), self.device)
        key = (id(stack), slots.data_ptr(), slots.shape)  # the cache's slots stay put; a bench's may not
        if key not in self._operands:
            self._operands[key] = GatherOperands.of(slots, stack)
        gather_experts_triton(slots, stack, pairs, self.config, self._operands[key])

    @property
    def dma(self) -> bool:
        """Whether batches go through the copy engines (and so want long runs: SlotRing places them for it)."""
        return self.form.startswith("dma")

    def copy_runs(self, slots, stack, experts: np.ndarray, targets: np.ndarray) -> None:
        """The copy engines' form on the current stream: the batch's runs, three strided copies each."""
        plan = plan_copies(group_runs(experts, targets), part_bytes(stack), slots.stride(0) * slots.element_size(),
                           one_row=self.form == "dma1d")
        stream = torch.cuda.current_stream(self.device) if self.cuda else None
        engine = copy_engine() if self.cuda else None
        self.copied_by = run_plan(slots, (stack.gate.raw, stack.up.raw, stack.down.raw), plan, stream, engine)
        self.copies += len(plan)

    def _kernel_reads(self, stack) -> bool:
        if self.per_part:
            return False
        if id(stack) not in self._pinned:
            parts = (stack.gate.raw, stack.up.raw, stack.down.raw)  # flat views of these are what the kernel reads
            self._pinned[id(stack)] = all(p.is_pinned() and p.is_contiguous() for p in parts)
        return self._pinned[id(stack)]

    @staticmethod
    def _copy_parts(slots, stack, experts, targets) -> None:
        """The previous form: three host-to-device copies an expert (each ~11 us of host time)."""
        for e, slot in zip(experts.tolist(), targets.tolist()):
            offset = 0
            for part in (stack.gate.raw[e], stack.up.raw[e], stack.down.raw[e]):
                slots[slot, offset : offset + part.numel()].copy_(part.reshape(-1), non_blocking=True)
                offset += part.numel()

    def drain(self) -> None:
        """Make the compute stream wait for every copy queued so far (before it writes memory they may write)."""
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_stream(self.stream)

    def wait(self, event) -> None:
        """Make the compute stream wait for `event` (kernels launched after this see the copy's bytes)."""
        if self.cuda and event is not None:
            torch.cuda.current_stream(self.device).wait_event(event)
