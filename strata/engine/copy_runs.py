"""A batch of (expert -> slot) copies as a few large strided copies: the plan the copy engines execute.

Why: the copy engines (cudaMemcpy2DAsync from pinned host memory) move bytes without taking an SM from the layer
computing beside them, but each call costs the host a few microseconds; a layer streams hundreds of experts, so the
calls must be few. Experts that are consecutive in the host stacks AND go to consecutive slot rows form a run; a run
is three 2D copies (gate, up, down), each `height` rows of one part's bytes an expert, read at the part's pitch on
the host and written at the slot's pitch on the device.

`group_runs` finds the runs (pairs taken in expert order: a run is consecutive in both, so this order makes every
run maximal); `plan_copies` turns them into copy records; `apply_plan` runs the records with torch on strided views
(the CPU, and the GPU's fallback when no CUDA runtime is reachable); engine/dma_copy.py hands the same records to
the CUDA runtime.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# The columns of a plan's records: which host part (0 gate, 1 up, 2 down), the byte offsets into the slots (flat)
# and into that part's stack (flat), the bytes a row and the rows.
PART, DST, SRC, WIDTH, HEIGHT = range(5)


@dataclass(frozen=True)
class Runs:
    experts: np.ndarray  # first expert of each run
    slots: np.ndarray  # its slot
    lengths: np.ndarray  # experts in the run

    def __len__(self) -> int:
        return len(self.lengths)


def group_runs(experts: np.ndarray, targets: np.ndarray) -> Runs:
    """The maximal runs of (expert, slot) pairs consecutive in both expert and slot (pairs distinct by expert)."""
    experts, targets = np.asarray(experts, dtype=np.int64), np.asarray(targets, dtype=np.int64)
    order = np.argsort(experts, kind="stable")
    e, s = experts[order], targets[order]
    if not len(e):
        return Runs(e, s, np.zeros(0, dtype=np.int64))
    starts = np.flatnonzero(np.concatenate([[True], (np.diff(e) != 1) | (np.diff(s) != 1)]))
    lengths = np.diff(np.append(starts, len(e)))
    return Runs(e[starts], s[starts], lengths)


def plan_copies(runs: Runs, parts: tuple[int, int, int], slot_pitch: int, one_row: bool = False) -> np.ndarray:
    """int64 [n, 5] records (PART, DST, SRC, WIDTH, HEIGHT), run by run, each run's three parts in slot order.
    `one_row`: every expert part its own record (one 1D copy each, for comparison with the 2D copies)."""
    if one_row and len(runs):
        expand = np.repeat(np.arange(len(runs)), runs.lengths)
        within = np.arange(len(expand)) - np.repeat(np.cumsum(runs.lengths) - runs.lengths, runs.lengths)
        runs = Runs(runs.experts[expand] + within, runs.slots[expand] + within, np.ones(len(expand), dtype=np.int64))
    n = len(runs)
    plan = np.empty((n, 3, 5), dtype=np.int64)
    offset = 0
    for k, width in enumerate(parts):
        plan[:, k, PART] = k
        plan[:, k, DST] = runs.slots * slot_pitch + offset
        plan[:, k, SRC] = runs.experts * width
        plan[:, k, WIDTH] = width
        plan[:, k, HEIGHT] = runs.lengths
        offset += width
    return plan.reshape(n * 3, 5)


def flat_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's storage as flat uint8 (the byte offsets of a plan index into it)."""
    return tensor.reshape(-1).view(torch.uint8)


def apply_plan(slots: torch.Tensor, sources: tuple, plan: np.ndarray, non_blocking: bool = False) -> None:
    """Run the records with torch: each one's rows as strided views of the slots' and the part's bytes."""
    dst, pitch = flat_bytes(slots), slots.stride(0) * slots.element_size()
    flats = [flat_bytes(p) for p in sources]
    base = dst.storage_offset()  # as_strided's offsets count from the storage's start, not the view's
    for part, d, s, width, height in plan.tolist():
        src = flats[part].as_strided((height, width), (width, 1), flats[part].storage_offset() + s)
        dst.as_strided((height, width), (pitch, 1), base + d).copy_(src, non_blocking=non_blocking)
