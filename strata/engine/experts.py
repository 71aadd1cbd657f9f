"""Expert execution backends: how the routed experts of a MoE layer are computed. The model never knows which."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from strata.models.weights import QuantWeight, linear


@dataclass
class ExpertStack:
    """One layer's routed experts as llama.cpp stacks them: gate/up [E, ff, embd], down [E, embd, ff]."""

    gate: QuantWeight
    up: QuantWeight
    down: QuantWeight

    @property
    def n_bytes(self) -> int:
        return self.gate.n_bytes + self.up.n_bytes + self.down.n_bytes


class ExpertBackend(ABC):
    name: str

    @abstractmethod
    def run(self, layer: int, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Sum over each token's chosen experts of weight * expert(x). x: [T, embd]; weights, ids: [T, k]."""


def run_expert(stack: ExpertStack, expert: int, x: torch.Tensor) -> torch.Tensor:
    """SwiGLU of one expert, dequantizing only that expert's slices of the stacked tensors."""
    return linear(F.silu(linear(x, stack.gate[expert])) * linear(x, stack.up[expert]), stack.down[expert])


class ResidentExperts(ExpertBackend):
    """Every expert lives on the compute device in its quant format; each used one is dequantized on use."""

    name = "resident"

    def __init__(self, stacks: dict[int, ExpertStack]):
        self.stacks = stacks

    def run(self, layer, x, weights, ids):
        stack = self.stacks[layer]
        out = torch.zeros_like(x)
        for expert in ids.unique().tolist():
            token, slot = (ids == expert).nonzero(as_tuple=True)
            y = run_expert(stack, expert, x[token])
            out.index_add_(0, token, y * weights[token, slot, None].to(x.dtype))
        return out


EXPERT_BACKENDS = {ResidentExperts.name: ResidentExperts}
