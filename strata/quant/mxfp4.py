"""MXFP4 (OCP microscaling): 32 e2m1 weights sharing one power-of-two (e8m0) scale byte."""

import torch

from strata.quant.fields import planes
from strata.quant.tables import lookup


def half_scale(e: torch.Tensor) -> torch.Tensor:
    """e8m0 exponent byte -> 2^(e-127) / 2 as float32 (halved to undo the doubled levels); e < 2 is subnormal."""
    e = e.int()
    bits = torch.where(e < 2, 0x00200000 << e, (e - 1) << 23)
    return bits.view(torch.float32)


def mxfp4(blocks: torch.Tensor) -> torch.Tensor:
    return half_scale(blocks[:, 0:1]) * lookup("mxfp4", planes(blocks[:, 1:17], 4).flatten(-2))
