"""QSA indexer keys: one pooled key per completed block of 4 cells, and the `dead` key that stands in for the tail.

`pooled[b] = rope(rmsnorm(mean of the block's 4 raw keys) * w, position of the block's first cell)`, computed in
float64 and stored as float32; `dead = rmsnorm(raw key of cell 0) * w`, not rotated. RoPE is NEOX over the first
`n_rot` dims.
"""

from __future__ import annotations

import torch

BLOCK = 4


def rope_neox(x: torch.Tensor, pos: torch.Tensor, n_rot: int = 64, base: float = 1e7) -> torch.Tensor:
    """Rotate pairs (i, i + n_rot/2) of the first `n_rot` dims of `x` [..., D] by `pos` [...] (in x's dtype)."""
    half = n_rot // 2
    inv_freq = base ** (-torch.arange(half, dtype=torch.float64, device=x.device) / half)
    angle = (pos.to(torch.float64)[..., None] * inv_freq).to(x.dtype)
    cos, sin = angle.cos(), angle.sin()
    a, b = x[..., :half], x[..., half:n_rot]
    return torch.cat([a * cos - b * sin, b * cos + a * sin, x[..., n_rot:]], -1)


def _rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * weight.to(x.dtype)


def pool_block_keys(raw: torch.Tensor, k_norm: torch.Tensor, first_block: int = 0, eps: float = 1e-6,
                    n_rot: int = 64, base: float = 1e7) -> torch.Tensor:
    """Pooled keys [n, Dk] (float32) of the completed blocks whose raw keys `raw` [4n, Dk] start at `first_block`."""
    pos = (torch.arange(raw.shape[0] // BLOCK, device=raw.device) + first_block) * BLOCK
    return pool_keys_at(raw, k_norm, pos, eps, n_rot, base)


def pool_keys_at(raw: torch.Tensor, k_norm: torch.Tensor, first_cells: torch.Tensor, eps: float = 1e-6,
                 n_rot: int = 64, base: float = 1e7) -> torch.Tensor:
    """Pooled keys [n, Dk] (float32) of the blocks whose raw keys are `raw` [4n, Dk] and whose first cells are at
    `first_cells` [n] (a device tensor: the static decode step pools its own block without the host)."""
    blocks = raw.to(torch.float64).unflatten(0, (-1, BLOCK)).mean(1)
    return rope_neox(_rmsnorm(blocks, k_norm, eps), first_cells, n_rot, base).float()


def dead_key(raw_cell0: torch.Tensor, k_norm: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """The tail's stand-in key [Dk] (float32): the normalized raw key of cell 0, at position 0 (no rotation)."""
    return _rmsnorm(raw_cell0.to(torch.float64), k_norm, eps).float()
