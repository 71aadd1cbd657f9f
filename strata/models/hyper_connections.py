"""qwen4exp's residual: a stack of `hc` streams ("hyper-connections") read and written through a low-rank gate.

The residual R is [T, hc, embd] (float32). Each half-layer reads one mixed vector from it and writes its output
back into every stream (Strata's `gr_read` / `gr_write`, include/strata/kernels/gr.hpp, src/kernels/gr_parity.cpp):

    xn[c]   = rmsnorm(R[c]) * norm[c]                 one RMS per stream, not over the whole stack
    lo      = silu((down @ xn) / hc)                  the 1/hc sits inside the SiLU
    mixed   = mean_c xn[c] * sigmoid((up @ lo)[c])    a mean over streams, not a sum
    inject  = inject_w @ xn                           [hc]; the final read (before the head) has none
    R[c]   += y * 2 * sigmoid(inject[c] / hc)         2*sigmoid centres the gate on 1

On few rows (a decode step, a verify window: at most MAX_ROWS) on a GPU, and on the CPU under FUSED_ON_CPU, a read
runs as three Triton launches (kernels/hc) with the previous write folded in: hc_write_read. A prompt's read keeps
torch's GEMMs with the elementwise work in two row-wise kernels. hc_read, hc_write's torch lines and
grouped_rms_norm are the reference, which the CPU and the float32 (exact) mode keep.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from strata import switches
from strata.models import layers
from strata.models.weights import FLOAT_VIEWS, QuantWeight, linear

MAX_ROWS = 4  # up to a verify window; a prompt's rows go through the GEMMs (kernels/quant/matvec.py's bound)


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
    if _on_kernels(residual, y.dtype):  # one pass, any row count
        from strata.kernels.hc.write_stats import write_stats_triton

        return write_stats_triton(residual.contiguous(), 0.0, y, inject)[0]
    hc = residual.shape[1]
    return residual + y.float()[:, None, :] * (2 * torch.sigmoid(inject.float() / hc))[:, :, None]


def hc_write_read(residual: torch.Tensor, w: HyperConnectionWeights, eps: float,
                  pending: tuple[torch.Tensor, torch.Tensor] | None = None, dtype: torch.dtype = torch.float32
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The pending write (y [T, embd], inject [T, hc]) if any, then the read: (the residual after the write, mixed
    [T, embd] in `dtype`, inject [T, hc] or None). Few rows on a GPU take three launches (kernels/hc/read.py)."""
    if _fused_read(residual, w, dtype):
        from strata.kernels.hc.read import hc_read_triton

        return hc_read_triton(residual, w.norm, _matrix(w.down), _matrix(w.up),
                              None if w.inject is None else _matrix(w.inject), eps, dtype, pending)
    if _on_kernels(residual, dtype):  # a prompt's rows, or quantized matrices
        return _read_many_rows(residual, w, eps, pending, dtype)
    if pending is not None:
        residual = hc_write(residual, *pending)
    mixed, inject = hc_read(residual, w, eps)
    return residual, mixed.to(dtype), inject


def _read_many_rows(residual: torch.Tensor, w: HyperConnectionWeights, eps: float,
                    pending: tuple[torch.Tensor, torch.Tensor] | None, dtype: torch.dtype
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A prompt's read (or one whose matrices are quantized): the GEMMs (matvecs) as hc_read runs them, the
    elementwise work around them in two row-wise kernels (the write + statistics + normalised stack; the gate + mean
    + cast) instead of about twenty passes."""
    from strata.kernels.hc.gate_mix import gate_mix_triton
    from strata.kernels.hc.write_stats import write_stats_triton

    y, gate = pending if pending is not None else (None, None)
    residual, _, xn = write_stats_triton(residual.contiguous(), eps, y, gate, norm=w.norm.contiguous())
    flat = xn.view(residual.shape[0], -1)
    with _tf32(residual.is_cuda and not switches.get("STRATA_HC_FP32")):
        low = F.silu(linear(flat, w.down) / residual.shape[1])
        mixed = gate_mix_triton(xn, linear(low, w.up), dtype)
        return residual, mixed, (linear(flat, w.inject) if w.inject is not None else None)


@contextlib.contextmanager
def _tf32(wanted: bool):
    """A prompt's float32 GEMMs on TF32 tensor cores (the H200: a 4,096-row read in 0.49 ms against 1.49 in float32,
    whose GEMMs took ~16 % of a prompt's GPU time). Their inputs lose 13 mantissa bits, an error of ~1e-4 of the
    result against the bf16 rounding (4e-3) of the mixed row they feed; `bench hc-read --prompt` checks it against
    float64. torch's setting is global: the caller's comes back however the block ends."""
    if not wanted:
        yield
        return
    matmul = torch.backends.cuda.matmul
    # torch >= 2.9's setting (the older flag warns there), else the older flag
    name, value = ("fp32_precision", "tf32") if hasattr(matmul, "fp32_precision") else ("allow_tf32", True)
    before = getattr(matmul, name)
    setattr(matmul, name, value)
    try:
        yield
    finally:
        setattr(matmul, name, before)


def _on_kernels(residual: torch.Tensor, compute_dtype: torch.dtype) -> bool:
    """On CUDA (or FUSED_ON_CPU), a float32 stack, a model computing below float32 (the exact mode stays torch's, as
    models/layers.py `_fused` keeps it)."""
    return ((residual.is_cuda or layers.FUSED_ON_CPU) and residual.dtype == torch.float32 and residual.dim() == 3
            and compute_dtype in (torch.bfloat16, torch.float16) and not switches.get("STRATA_HC_TORCH"))


def _fused_read(residual: torch.Tensor, w: HyperConnectionWeights, dtype: torch.dtype) -> bool:
    """Whether the read takes the kernels: few rows, float weights (BF16 in the files) beside the stack."""
    matrices = [w.down, w.up] + ([w.inject] if w.inject is not None else [])
    return (_on_kernels(residual, dtype) and residual.shape[0] <= MAX_ROWS
            and all(m.ggml_type in FLOAT_VIEWS and m.device == residual.device for m in matrices))


def _matrix(weight: QuantWeight) -> torch.Tensor:
    """A float weight as its stored dtype, a view of its bytes (no conversion)."""
    return weight.dequantize(FLOAT_VIEWS[weight.ggml_type])
