"""Balanced routing for load tests of the prompt path (`strata bench prompt --routing balanced`).

A synthetic model's random weights route a chunk's tokens to few experts (the full-size qwen4exp file: ~80 of 512 a
layer over 2,419 tokens), so its prompt streams little and its PCIe floor says little about a trained model, whose
balanced routing sends every chunk to nearly every expert. Balanced routing replaces a prompt chunk's expert ids
after the router has run (its cost stays in the time): token t takes experts (t * k + j + 7 * layer) mod E, j < k,
so every expert gets T * k / E tokens (+-1) and each token k distinct experts, with equal weights 1 / k. The model's
outputs are then not its own: a timing tool only, never the engine's default.
"""

from __future__ import annotations

import torch

LAYER_SHIFT = 7  # layers start their round-robin at different experts


def balanced_routing(n_tokens: int, k: int, n_experts: int, layer: int, device: torch.device,
                     ids_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] float32, ids [T, k] ids_dtype): every expert gets T * k / E tokens, a token k distinct ones."""
    slots = torch.arange(n_tokens * k, device=device).view(n_tokens, k) + LAYER_SHIFT * layer
    ids = (slots % n_experts).to(ids_dtype)
    return torch.full((n_tokens, k), 1.0 / k, dtype=torch.float32, device=device), ids
