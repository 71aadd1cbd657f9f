"""A layer of Q4_0 experts partly in cache slots (the others not resident: they must add exactly zero), a routing
over it and the float64 references: the decode GEMV kernels' "from slots" tests share it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from strata.bench.moe_decode import routing, slots_of, synthetic_stack
from strata.kernels.moe.gemv import ERROR_BOUND, DecodeExperts, moe_gemv_float64, relative_error


def cpu_stack(stack):
    """The same expert stack on the host (the float64 reference runs there)."""
    from strata.engine.experts import ExpertStack

    return ExpertStack(*(p.to("cpu") for p in (stack.gate, stack.up, stack.down)))


@dataclass
class PartlyCached:
    cached: DecodeExperts  # the resident experts' slots and their table
    x: torch.Tensor
    ids: torch.Tensor
    weights: torch.Tensor
    resident: torch.Tensor  # bool [T, k]: whether each routed pair's expert is in a slot
    h64: torch.Tensor  # float64 H of every pair
    y64: torch.Tensor  # float64 output of the resident pairs alone

    def check(self, h: torch.Tensor, y: torch.Tensor) -> None:
        """The kernels' H and output: absent pairs exactly zero, the rest within the bound of float64."""
        assert (h.cpu()[~self.resident] == 0).all()
        assert relative_error(h, self.h64 * self.resident[:, :, None]) <= ERROR_BOUND
        assert relative_error(y, self.y64) <= ERROR_BOUND


def partly_cached(device, n_experts: int, n_resident: int, n_tokens: int, top_k: int, shared: int,
                  seed: int) -> PartlyCached:
    stack = synthetic_stack("Q4_0", "Q4_0", n_experts, 128, 64, seed=seed, device=device)
    gen = torch.Generator().manual_seed(seed + 1)
    order = torch.randperm(n_experts, generator=gen)
    slots, table = slots_of(stack, order, n_resident)  # experts order[n_resident:] are not resident
    cached = DecodeExperts.of_slots(slots, table, stack)
    ids, w = routing(n_tokens, top_k, n_experts, gen, shared=shared)
    x = torch.randn(n_tokens, 128, generator=gen)
    resident = torch.isin(ids, order[:n_resident])
    assert not resident.all() and resident.any()
    h64, y64 = moe_gemv_float64(x, ids, w * resident, DecodeExperts.of_stack(cpu_stack(stack)))
    return PartlyCached(cached, x.to(device), ids.to(device), w.to(device), resident, h64, y64)
