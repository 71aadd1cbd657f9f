"""One hyper-connection read on few rows in three launches, the previous half-layer's write folded into the first:
write_stats (R += y * 2 sigmoid(inject / hc), each stream's rstd), down_inject (lo, inject), up_mix (mixed)."""

from __future__ import annotations

import torch

from strata.kernels.hc.down_inject import down_inject_triton
from strata.kernels.hc.up_mix import up_mix_triton
from strata.kernels.hc.write_stats import write_stats_triton


def hc_read_triton(residual: torch.Tensor, norm: torch.Tensor, down: torch.Tensor, up: torch.Tensor,
                   inject: torch.Tensor | None, eps: float, dtype: torch.dtype = torch.float32,
                   pending: tuple[torch.Tensor, torch.Tensor] | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """residual [T, hc, embd] float32; norm [hc*embd]; down, up, inject the float weight matrices; pending the
    write (y [T, embd], inject [T, hc]) not yet applied, or None. Returns (the residual after that write, mixed
    [T, embd] in `dtype`, inject [T, hc] float32 or None)."""
    residual = residual.contiguous()
    y, gate = pending if pending is not None else (None, None)
    residual, rstd, _ = write_stats_triton(residual, eps, y, gate)
    norm = norm.contiguous()
    lo, injected = down_inject_triton(residual, rstd, norm, down.contiguous(),
                                      None if inject is None else inject.contiguous())
    return residual, up_mix_triton(residual, rstd, norm, up.contiguous(), lo, dtype), injected
