"""Projections that read the same input through one matvec where their weights share a block format: a decode
step launches one GEMV instead of several (attention's q, k, v; a GatedDeltaNet layer's qkv, output gate z, b, a).

The stack is made at load on a GPU (and on the CPU under FUSED_ON_CPU, the interpreted run that counts and tests
the GPU's launches); the weights become views of its rows (weights.stacked_rows), so nothing is held twice."""

from __future__ import annotations

import torch

from strata.models import layers
from strata.models.weights import QuantWeight, linear, stacked_rows


def stack_projections(name: str, weights: tuple[QuantWeight, ...],
                      parts: tuple[int, ...]) -> tuple[QuantWeight | None, int, tuple[QuantWeight, ...]]:
    """(the stack or None, how many of `weights` it holds from the first, the weights: views where stacked), for
    the first count in `parts` whose leading weights share a format (a GatedDeltaNet's b and a are often kept in
    another, or float: (4, 2))."""
    if weights[0].device.type != "cuda" and not layers.FUSED_ON_CPU:
        return None, 0, weights
    for n_parts in parts:
        stacked = stacked_rows(name, *weights[:n_parts])
        if stacked is not None:
            return stacked[0], n_parts, (*stacked[1:], *weights[n_parts:])
    return None, 0, weights


def _one_matvec(x: torch.Tensor, stack: QuantWeight) -> bool:
    """Whether the stack is read at once: a GPU decode step the matvec kernel takes; on the CPU, the same rows
    under FUSED_ON_CPU (torch's linear there, the split the GPU's)."""
    from strata.kernels.quant.matvec import MAX_ROWS, matvec_applies

    if x.is_cuda:
        return matvec_applies(x, stack.ggml_type)
    return layers.FUSED_ON_CPU and x.dim() == 2 and x.shape[0] <= MAX_ROWS


def project_inputs(x: torch.Tensor, stack: QuantWeight | None, n_parts: int, weights: tuple[QuantWeight, ...],
                   biases: tuple[torch.Tensor | None, ...] | None = None) -> list[torch.Tensor]:
    """[linear(x, w, bias) for each weight]: the stacked ones as column slices of one matvec's output (each bias
    added to its slice, as `linear` adds it to a matvec's output)."""
    biases = biases or (None,) * len(weights)
    if stack is not None and _one_matvec(x, stack):
        outs = linear(x, stack).split([w.shape[0] for w in weights[:n_parts]], dim=-1)
        return ([t if b is None else t + b for t, b in zip(outs, biases)]
                + [linear(x, w, b) for w, b in zip(weights[n_parts:], biases[n_parts:])])
    return [linear(x, w, b) for w, b in zip(weights, biases)]
