"""A GatedDeltaNet layer's four input projections (qkv, the output gate z, b and a: all read the same x) through
one matvec where they share a block format: a decode step launches one GEMV instead of four.

The stack is made at load on a GPU (and on the CPU under FUSED_ON_CPU, the interpreted run that counts and tests
the GPU's launches); the four weights become views of its rows, so nothing is held twice."""

from __future__ import annotations

import torch

from strata.models import layers
from strata.models.weights import QuantWeight, linear, stacked_rows

STACK_MAX_ROWS = 4  # the matvec kernel's rows (kernels/quant/matvec.py MAX_ROWS): the CPU seam takes the same


def stack_projections(name: str, qkv: QuantWeight, gate: QuantWeight, b: QuantWeight,
                      a: QuantWeight) -> tuple[QuantWeight | None, int, tuple[QuantWeight, ...]]:
    """(the stack or None, how many of qkv, gate, b, a it holds in that order, the four weights): all four where
    they share a format, else qkv and gate (b and a are often kept in another, or float)."""
    weights = (qkv, gate, b, a)
    if qkv.device.type != "cuda" and not layers.FUSED_ON_CPU:
        return None, 0, weights
    for n_parts in (4, 2):
        stacked = stacked_rows(name, *weights[:n_parts])
        if stacked is not None:
            return stacked[0], n_parts, (*stacked[1:], *weights[n_parts:])
    return None, 0, weights


def _one_matvec(x: torch.Tensor, stack: QuantWeight) -> bool:
    """Whether the stack is read at once: a GPU decode step the matvec kernel takes; on the CPU, the same rows
    under FUSED_ON_CPU (torch's linear there, the split the GPU's)."""
    if x.is_cuda:
        from strata.kernels.quant.matvec import matvec_applies

        return matvec_applies(x, stack.ggml_type)
    return layers.FUSED_ON_CPU and x.dim() == 2 and x.shape[0] <= STACK_MAX_ROWS


def project_inputs(x: torch.Tensor, stack: QuantWeight | None, n_parts: int,
                   weights: tuple[QuantWeight, ...]) -> list[torch.Tensor]:
    """[x @ qkv, x @ gate, x @ b, x @ a]: the stacked ones as column slices of one matvec's output."""
    if stack is not None and _one_matvec(x, stack):
        outs = list(linear(x, stack).split([w.shape[0] for w in weights[:n_parts]], dim=-1))
        return outs + [linear(x, w) for w in weights[n_parts:]]
    return [linear(x, w) for w in weights]
