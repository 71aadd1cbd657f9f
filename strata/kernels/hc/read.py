"""One hyper-connection read on few rows in three launches, the previous half-layer's write folded into the first:
write_stats (R += y * 2 sigmoid(inject / hc), each stream's rstd, the normalised stack xn = R * rstd * norm),
down_inject (lo, inject from xn), up_mix (mixed from xn and lo). xn is stored once (float32, 40 KB a row at full
size) so that the matvecs' programs read one tensor from L2 instead of R, rstd and norm each."""

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
    y, gate = pending if pending is not None else (None, None)
    residual, _, xn = write_stats_triton(residual.contiguous(), eps, y, gate, norm=norm.contiguous())
    lo, injected = down_inject_triton(xn, down.contiguous(), None if inject is None else inject.contiguous())
    return residual, up_mix_triton(xn, up.contiguous(), lo, dtype), injected
