"""The prompt expert paths reading experts from cache slots (`PromptExperts.over_slots` + `slot_of`): the same bytes
as reading the stacked tensors, since each routed row's products do not depend on where its expert lies."""

import pytest
import torch

from strata.bench.moe_prefill import make_layer
from strata.kernels.moe.prefill import PATHS, PromptExperts, moe_prefill_ref, moe_prefill_triton


def _into_slots(experts: PromptExperts, n_slots: int, spare: int, seed: int):
    """Experts copied into shuffled slots of one expert plus `spare` bytes each (as ExpertCache lays them out)."""
    parts = (experts.gate, experts.up, experts.down)
    slot_bytes = sum(m.expert_bytes for m in parts) + spare
    slots = torch.randint(0, 256, (n_slots, slot_bytes), dtype=torch.uint8, generator=torch.Generator().manual_seed(9))
    slot_of = torch.randperm(n_slots, generator=torch.Generator().manual_seed(seed))[: experts.n_experts]
    for e, slot in enumerate(slot_of.tolist()):
        slots[slot, : slot_bytes - spare] = torch.cat([m.raw[e].reshape(-1).cpu() for m in parts])
    return slots, slot_of.int()


@pytest.mark.parametrize("path", PATHS)
def test_slots_read_the_same_experts(device, path):
    layer = make_layer("Q2_0 / Q2_0", 64, n_experts=16, n_embd=64, n_ff=64, top_k=4, seed=5, device=device)
    slots, slot_of = _into_slots(layer.experts, n_slots=40, spare=48, seed=1)
    slots, slot_of = slots.to(device), slot_of.to(device)
    over_slots = PromptExperts.over_slots(slots, layer.experts)
    args = (layer.x, layer.topk_ids, layer.topk_weights)
    stacked = moe_prefill_triton(*args, layer.experts, path)
    assert torch.equal(moe_prefill_triton(*args, over_slots, path, slot_of=slot_of), stacked)
    assert torch.equal(moe_prefill_ref(*args, over_slots, path, slot_of=slot_of),
                       moe_prefill_ref(*args, layer.experts, path))
