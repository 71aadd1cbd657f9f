"""The one-launch expert gather (kernels/moe/expert_gather.py): the kernel (interpreted on the CPU) and the torch
reference put exactly each chosen expert's gate, up and down bytes into its slot and leave every other byte alone,
for every word width the sizes allow; bad configs are refused in one line."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from strata.errors import StrataError
from strata.kernels.moe.expert_gather import (GatherConfig, gather_experts_ref, gather_experts_triton, gather_pairs,
                                              word_bytes)

N_EXPERTS = 7


def _stack(part_sizes, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    parts = [torch.randint(0, 256, (N_EXPERTS, 2, n // 2), generator=g, dtype=torch.uint8) for n in part_sizes]
    if device == "cuda":  # where the engine keeps them: pinned host RAM, read by the kernel through UVA
        parts = [p.pin_memory() for p in parts]
    return SimpleNamespace(**{name: SimpleNamespace(raw=p) for name, p in zip(("gate", "up", "down"), parts)})


def _expected(slots, stack, experts, targets):
    out = slots.clone()
    for e, s in zip(experts.tolist(), targets.tolist()):
        row = torch.cat([p.raw[e].reshape(-1) for p in (stack.gate, stack.up, stack.down)])
        out[s, : row.numel()] = row
    return out


@pytest.mark.parametrize("sizes, slot_bytes, width", [((96, 96, 160), 360, 8), ((36, 36, 44), 120, 4),
                                                      ((18, 18, 26), 70, 2), ((6, 6, 10), 23, 1)])
@pytest.mark.parametrize("config", ["p3b16w1", "p64b32w2"])  # fewer programs than tiles (loops); more than tiles
def test_kernel_and_reference_copy_exactly_the_chosen_experts(device, sizes, slot_bytes, width, config):
    stack = _stack(sizes, device)
    slots = torch.full((9, slot_bytes), 0xA5, dtype=torch.uint8, device=device)  # stale bytes that must survive
    assert word_bytes(slots, stack) == width
    experts, targets = np.array([4, 0, 6, 2, 5]), np.array([8, 1, 3, 0, 6])
    expected = _expected(slots, stack, experts, targets)
    by_ref = slots.clone()
    gather_experts_ref(by_ref, stack, torch.from_numpy(experts), torch.from_numpy(targets))
    assert torch.equal(by_ref, expected)
    by_kernel = slots.clone()
    gather_experts_triton(by_kernel, stack, gather_pairs(experts, targets).to(device), GatherConfig.parse(config))
    assert torch.equal(by_kernel, expected)


def test_an_empty_list_copies_nothing(device):
    stack, slots = _stack((96, 96, 160), device), torch.zeros((2, 352), dtype=torch.uint8, device=device)
    gather_experts_triton(slots, stack, gather_pairs(np.array([], int), np.array([], int)).to(device))
    assert not slots.any()


def test_the_queue_launches_the_kernel_with_its_config(device):
    from strata.engine.copy_queue import CopyQueue

    stack = _stack((96, 96, 160), device, seed=1)
    slots = torch.full((6, 352), 7, dtype=torch.uint8, device=device)
    experts, targets = np.array([6, 1, 3]), np.array([2, 5, 0])
    queue = CopyQueue(torch.device(device))
    queue.config = GatherConfig.parse("p2b16w1")
    queue.launch(slots, stack, experts, targets)
    assert torch.equal(slots, _expected(torch.full_like(slots, 7), stack, experts, targets))


def test_config_text():
    assert GatherConfig.parse("p16b4096w8") == GatherConfig(16, 4096, 8)
    assert GatherConfig.parse("w8") == GatherConfig(warps=8) and GatherConfig().name() == "p66b2048w4"
    for bad in ("p0", "b100", "x3", "p", "w3"):
        with pytest.raises(StrataError, match="expert gather config"):
            GatherConfig.parse(bad)
