"""The copy engines' form of streaming (STRATA_PF_STREAM=dma; engine/copy_runs.py): a batch's (expert -> slot) pairs
grouped into maximal runs, each pair copied exactly once, and the plan's strided copies (run here by torch on the
same views the GPU's cudaMemcpy2DAsync calls get) leaving the bytes of `gather_experts_ref` in the slots."""

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from strata import switches
from strata.engine.copy_queue import CopyQueue, copy_stream_priority, stream_form
from strata.engine.copy_runs import DST, HEIGHT, PART, SRC, WIDTH, group_runs, plan_copies
from strata.engine.dma_copy import run_plan
from strata.engine.slot_ring import SlotRing
from strata.errors import StrataError
from strata.kernels.moe.expert_gather import gather_experts_ref

N_EXPERTS = 40
SIZES = (24, 24, 40)  # gate, up, down bytes an expert


def _stack(seed=0):
    g = torch.Generator().manual_seed(seed)
    parts = [torch.randint(0, 256, (N_EXPERTS, 2, n // 2), generator=g, dtype=torch.uint8) for n in SIZES]
    return SimpleNamespace(gate=SimpleNamespace(raw=parts[0]), up=SimpleNamespace(raw=parts[1]),
                           down=SimpleNamespace(raw=parts[2]), n_experts=N_EXPERTS, expert_bytes=sum(SIZES))


def _check_runs(experts, targets):
    runs = group_runs(experts, targets)
    pairs = set(zip(experts.tolist(), targets.tolist()))
    covered = []
    for e, s, n in zip(runs.experts.tolist(), runs.slots.tolist(), runs.lengths.tolist()):
        assert n >= 1
        covered += [(e + i, s + i) for i in range(n)]
    assert sorted(covered) == sorted(pairs) and len(covered) == len(set(covered))  # each pair exactly once
    ends = {(e + n - 1, s + n - 1) for e, s, n in zip(runs.experts, runs.slots, runs.lengths)}
    starts = set(zip(runs.experts.tolist(), runs.slots.tolist()))
    assert not {(e + 1, s + 1) for e, s in ends} & starts  # maximal: no run continues into another
    return runs


def test_runs_follow_the_layout():
    runs = _check_runs(np.array([5, 1, 2, 3, 9, 6, 4]), np.array([14, 10, 11, 12, 3, 15, 20]))
    # 1-3 -> 10-12; 4 -> 20 (the slot breaks it); 5-6 -> 14-15; 9 -> 3
    assert runs.experts.tolist() == [1, 4, 5, 9] and runs.lengths.tolist() == [3, 1, 2, 1]
    assert len(group_runs(np.array([], dtype=np.int64), np.array([], dtype=np.int64))) == 0
    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(1, N_EXPERTS + 1))
        experts = rng.choice(N_EXPERTS, n, replace=False)
        targets = np.argsort(experts) + int(rng.integers(0, 5)) if rng.random() < 0.5 else rng.permutation(60)[:n]
        _check_runs(experts, targets)


def _slots(n_rows, pad=5):
    """Slots with stale bytes that must survive, as a view that starts inside its storage (offsets must allow it)."""
    return torch.full((n_rows + 1, sum(SIZES) + pad), 0xA5, dtype=torch.uint8)[1:]


@pytest.mark.parametrize("case", ["one", "whole layer", "out of order", "gappy", "random"])
@pytest.mark.parametrize("form", ["dma", "dma1d"])
def test_the_plan_moves_the_bytes_of_the_reference(case, form):
    stack, rng = _stack(), np.random.default_rng(len(case))
    experts, targets = {
        "one": (np.array([17]), np.array([3])),
        "whole layer": (np.arange(N_EXPERTS), np.arange(N_EXPERTS) + 2),
        "out of order": (rng.permutation(N_EXPERTS)[:25], rng.permutation(N_EXPERTS + 4)[:25]),
        "gappy": (np.flatnonzero(rng.random(N_EXPERTS) > 0.12), None),  # ~12 % already present, as at 12 GiB
        "random": (rng.permutation(N_EXPERTS)[:9], rng.permutation(9) + 10),
    }[case]
    if targets is None:
        targets = np.arange(len(experts)) + 1
    slots = _slots(N_EXPERTS + 5)
    want = slots.clone()
    gather_experts_ref(want, stack, torch.from_numpy(experts), torch.from_numpy(targets))
    with switches.override(STRATA_PF_STREAM=form):
        queue = CopyQueue(torch.device("cpu"))
    queue.gather(slots, stack, experts, targets)
    assert torch.equal(slots, want) and queue.copied_by == "torch"
    runs = group_runs(experts, targets)
    assert queue.copies == 3 * (len(experts) if form == "dma1d" else len(runs))
    plan = plan_copies(runs, SIZES, slots.stride(0), one_row=form == "dma1d")
    assert (plan[:, WIDTH] * plan[:, HEIGHT]).sum() == len(experts) * sum(SIZES)  # nothing copied twice
    assert set(plan[:, PART].tolist()) == {0, 1, 2} and (plan[:, SRC] % plan[:, WIDTH] == 0).all()
    assert ((plan[:, DST] % slots.stride(0)) < sum(SIZES)).all()


class _HostEngine:
    """cudaMemcpy2DAsync's contract (rows of `width` bytes at each side's pitch) on host memory, row by row: checks
    the addresses the GPU's calls get."""

    def __init__(self):
        self.calls = 0

    def copy(self, dst, dst_pitch, src, src_pitch, width, height, stream):
        assert 0 < width <= min(dst_pitch, src_pitch) and height > 0 and stream == 7
        for row in range(height):
            ctypes.memmove(dst + row * dst_pitch, src + row * src_pitch, width)
        self.calls += 1

    def name(self):
        return "host memmove"


@pytest.mark.parametrize("one_row", [False, True])
def test_the_copy_engines_addresses_move_the_bytes_of_the_reference(one_row):
    stack, rng = _stack(4), np.random.default_rng(4)
    experts = rng.permutation(N_EXPERTS)[:30]
    targets = np.argsort(np.argsort(experts)) + 2  # mostly runs, as the ring places them
    targets[:3] = [40, 1, 0]
    slots = _slots(N_EXPERTS + 5)
    want = slots.clone()
    gather_experts_ref(want, stack, torch.from_numpy(experts), torch.from_numpy(targets))
    plan = plan_copies(group_runs(experts, targets), SIZES, slots.stride(0), one_row=one_row)
    engine = _HostEngine()
    sources = (stack.gate.raw, stack.up.raw, stack.down.raw)
    assert run_plan(slots, sources, plan, SimpleNamespace(cuda_stream=7), engine) == "host memmove"
    assert torch.equal(slots, want) and engine.calls == len(plan)


def test_the_switch_and_the_copy_streams_priority():
    assert stream_form() == "dma" and copy_stream_priority() == -1  # unset: the copy engines, the usual priority
    assert CopyQueue(torch.device("cpu")).dma
    with switches.override(STRATA_PF_STREAM="gather"):
        assert not CopyQueue(torch.device("cpu")).dma
    with switches.override(STRATA_PF_STREAM="gather-hi"):
        assert copy_stream_priority() == -3 and not CopyQueue(torch.device("cpu")).dma
    with switches.override(STRATA_PF_STREAM="DMA"):
        assert CopyQueue(torch.device("cpu")).dma and copy_stream_priority() == -1
    with switches.override(STRATA_PF_STREAM="dmaa"), pytest.raises(StrataError, match="STRATA_PF_STREAM='dmaa'"):
        CopyQueue(torch.device("cpu"))


@pytest.mark.parametrize("form", ["gather", "dma"])
def test_the_ring_places_a_batch_in_expert_order_for_the_copy_engines(form):
    stack = _stack(1)
    with switches.override(STRATA_PF_STREAM=form):
        queue = CopyQueue(torch.device("cpu"))
    slots = _slots(12)
    ring = SlotRing(slots, list(range(2, 12)), queue)
    got, copied = ring.hold_many(0, stack, np.array([7, 2, 3, 9, 4]))  # priority order, not expert order
    assert copied == 5 and sorted(got.tolist()) == [2, 3, 4, 5, 6]  # the same positions either way
    placed = dict(zip([7, 2, 3, 9, 4], got.tolist()))
    if form == "dma":
        assert placed == {2: 2, 3: 3, 4: 4, 7: 5, 9: 6} and queue.copies == 3 * 3  # runs 2-4, 7, 9
    else:
        assert placed == {7: 2, 2: 3, 3: 4, 9: 5, 4: 6} and queue.copies == 0
    for e, slot in placed.items():
        row = torch.cat([p.raw[e].reshape(-1) for p in (stack.gate, stack.up, stack.down)])
        assert torch.equal(slots[slot, : row.numel()], row)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the copy engines need a CUDA GPU (tools/device/dma.sh)")
@pytest.mark.parametrize("form", ["dma", "dma1d"])
def test_the_copy_engines_move_the_bytes_of_the_reference_on_a_gpu(form):
    """cudaMemcpy2DAsync through ctypes (not torch's fallback) from pinned stacks, on the queue's side stream."""
    stack = _stack(2)
    for part in (stack.gate, stack.up, stack.down):
        part.raw = part.raw.pin_memory()
    rng = np.random.default_rng(3)
    experts = np.flatnonzero(rng.random(N_EXPERTS) > 0.12)
    targets = np.arange(len(experts)) + 3
    targets[-4:] = targets[-4:][::-1].copy()  # a few slots out of order
    slots = _slots(N_EXPERTS + 5).cuda()
    want = slots.clone()
    gather_experts_ref(want, stack, torch.from_numpy(experts), torch.from_numpy(targets))
    with switches.override(STRATA_PF_STREAM=form):
        queue = CopyQueue(torch.device("cuda"))
    queue.wait(queue.gather(slots, stack, experts, targets))
    torch.cuda.synchronize()
    assert queue.copied_by != "torch", "no CUDA runtime or driver found to call: torch's strided copies ran"
    assert torch.equal(slots, want), queue.copied_by
