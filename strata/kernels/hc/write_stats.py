"""The pending hyper-connection write and the next read's statistics in one pass over the residual R [T, hc, embd]
(float32): R[t, c] += y[t] * 2 * sigmoid(inject[t, c] / hc), then rstd[t, c] = 1 / sqrt(mean(R[t, c]^2) + eps).
torch takes a sigmoid, a multiply, an add and a copy for the write and about six kernels for the statistics."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

NUM_WARPS = 4  # one program a (row, stream): 2,560 floats at full size, 20 a thread


@triton.jit
def _write_stats_kernel(r_ptr, y_ptr, inj_ptr, out_ptr, rstd_ptr, norm_ptr, xn_ptr, embd, inv_hc, eps,
                        HC: tl.constexpr, HAS_WRITE: tl.constexpr, STORE_XN: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    cols = tl.arange(0, BLOCK)
    mask = cols < embd
    base = (row * HC + c) * embd
    r = tl.load(r_ptr + base + cols, mask=mask, other=0.0)
    if HAS_WRITE:
        inj = tl.load(inj_ptr + row * HC + c).to(tl.float32) * inv_hc
        gate = 2.0 * (1.0 / (1.0 + tl.exp(-inj)))
        y = tl.load(y_ptr + row * embd + cols, mask=mask, other=0.0).to(tl.float32)
        r = r + y * gate
        tl.store(out_ptr + base + cols, r, mask=mask)
    rstd = 1.0 / tl.sqrt(tl.sum(r * r, axis=0) / embd + eps)
    tl.store(rstd_ptr + row * HC + c, rstd)
    if STORE_XN:  # the prompt's GEMMs read the normalised stack; the row is still in registers
        xn = r * rstd * tl.load(norm_ptr + c * embd + cols, mask=mask, other=0.0)
        tl.store(xn_ptr + base + cols, xn, mask=mask)


def write_stats_triton(residual: torch.Tensor, eps: float, y: torch.Tensor | None = None,
                       inject: torch.Tensor | None = None, num_warps: int = NUM_WARPS,
                       out: torch.Tensor | None = None,
                       norm: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """residual [T, hc, embd] float32 contiguous; y [T, embd] (any float dtype) and inject [T, hc] the pending write
    or None; norm [hc*embd] to store the normalised stack too. Returns (the residual after the write: `out` or a new
    tensor, or `residual` itself without a write; rstd [T, hc] float32; xn = R * rstd * norm [T, hc, embd] float32
    or None without `norm`)."""
    n_rows, hc, embd = residual.shape
    rstd = torch.empty(n_rows, hc, dtype=torch.float32, device=residual.device)
    has_write = y is not None
    if has_write:
        y, inject = y.contiguous(), inject.contiguous()
        out = torch.empty_like(residual) if out is None else out
    else:
        y = inject = out = residual  # unread: HAS_WRITE is off
    xn = torch.empty_like(residual) if norm is not None else None
    if n_rows:
        _write_stats_kernel[(n_rows, hc)](residual, y, inject, out, rstd, residual if norm is None else norm,
                                          residual if xn is None else xn, embd, 1.0 / hc, eps, HC=hc,
                                          HAS_WRITE=has_write, STORE_XN=xn is not None,
                                          BLOCK=triton.next_power_of_2(embd), num_warps=num_warps)
    return out, rstd, xn
