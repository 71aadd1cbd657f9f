"""MXFP4 (OCP microscaling): 32 e2m1 weights sharing one power-of-two (e8m0) scale byte."""

import functools

import torch

from strata.quant.fields import planes

# e2m1 magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6 doubled to integers; the top bit of a code is the sign.
_LEVELS = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


@functools.cache
def _levels(device: torch.device) -> torch.Tensor:
    return torch.tensor(_LEVELS, dtype=torch.float32, device=device)


def half_scale(e: torch.Tensor) -> torch.Tensor:
    """e8m0 exponent byte -> 2^(e-127) / 2 as float32 (halved to undo the doubled levels); e < 2 is subnormal."""
    e = e.int()
    bits = torch.where(e < 2, 0x00200000 << e, (e - 1) << 23)
    return bits.view(torch.float32)


def mxfp4(blocks: torch.Tensor) -> torch.Tensor:
    q = planes(blocks[:, 1:17], 4).flatten(-2).reshape(-1).long()
    levels = _levels(blocks.device).index_select(0, q).view(-1, 32)  # index_select: fast on CPU
    return half_scale(blocks[:, 0:1]) * levels
