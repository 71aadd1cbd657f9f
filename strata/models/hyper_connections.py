"""qwen4exp's residual: a stack of `hc` streams ("hyper-connections") read and written through a low-rank gate.

The residual R is [T, hc, embd] (float32). Each half-layer reads one mixed vector from it and writes its output
back into every stream (Strata's `gr_read` / `gr_write`, include/strata/kernels/gr.hpp, src/kernels/gr_parity.cpp):

    xn[c]   = rmsnorm(R[c]) * norm[c]                 one RMS per stream, not over the whole stack
    lo      = silu((down @ xn) / hc)                  the 1/hc sits inside the SiLU
    mixed   = mean_c xn[c] * sigmoid((up @ lo)[c])    a mean over streams, not a sum
    inject  = inject_w @ xn                           [hc]; the final read (before the head) has none
    R[c]   += y * 2 * sigmoid(inject[c] / hc)         2*sigmoid centres the gate on 1
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from strata.models.weights import QuantWeight, linear


@dataclass
class HyperConnectionWeights:
    norm: torch.Tensor  # [hc * embd], float32, used as stored (the converter folded any 1 + w in)
    down: QuantWeight  # [low rank, hc * embd]
    up: QuantWeight  # [hc * embd, low rank]
    inject: QuantWeight | None = None  # [hc, hc * embd]; None for the final read


def grouped_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., hc, embd] normalised per stream, times weight [hc * embd]."""
    xf = x.float()
    return xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * weight.float().view(x.shape[-2:])


def hc_read(residual: torch.Tensor, w: HyperConnectionWeights, eps: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(mixed [T, embd] float32, inject [T, hc] or None) from the residual [T, hc, embd]."""
    n_tokens, hc, _ = residual.shape
    xn = grouped_rms_norm(residual, w.norm, eps)
    flat = xn.reshape(n_tokens, -1)
    low = F.silu(linear(flat, w.down) / hc)
    gate = torch.sigmoid(linear(low, w.up)).view_as(xn)
    mixed = (xn * gate).mean(1)
    return mixed, (linear(flat, w.inject) if w.inject is not None else None)


def hc_write(residual: torch.Tensor, y: torch.Tensor, inject: torch.Tensor) -> torch.Tensor:
    """The residual with y [T, embd] added to every stream c, scaled by 2 * sigmoid(inject[:, c] / hc)."""
    hc = residual.shape[1]
    return residual + y.float()[:, None, :] * (2 * torch.sigmoid(inject.float() / hc))[:, :, None]
