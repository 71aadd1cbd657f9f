"""float64 definitions of a layer's routed experts, which every prompt path is measured against.

`rounding` applies what a path does to its inputs on top of the exact arithmetic: None (the definition), "int8"
(x and H rounded to int8 per 32 values, as the mmq and fused paths do) or "fp16" (x, H and the weights rounded to
fp16, as the dense path does).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from strata.kernels.moe.prefill import PromptExperts
from strata.kernels.moe.quantize32 import dequantize_rows_int8, quantize_rows_ref


def _rounded(v: torch.Tensor, rounding: str | None) -> torch.Tensor:
    if rounding == "int8":
        codes, scales, _ = quantize_rows_ref(v.float())
        return dequantize_rows_int8(codes, scales)
    if rounding == "fp16":
        return v.to(torch.float16).double()
    return v.double()


def moe_float64(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, stack,
                roundings=(None,)) -> dict:
    """{rounding: float64 [T, embd]}: sum_j w[t, j] * down(silu(gate(x_t)) * up(x_t)) on the dequantized weights,
    for each rounding in `roundings` (each expert's weights dequantized once for all of them)."""
    experts = PromptExperts.of(stack)
    xs = {r: _rounded(x, r) for r in roundings}
    ys = {r: torch.zeros(x.shape[0], experts.down.rows, dtype=torch.float64, device=x.device) for r in roundings}
    for e in topk_ids.unique().tolist():
        token, slot = (topk_ids == e).nonzero(as_tuple=True)
        weight = topk_weights[token, slot, None].double()
        exact = [m.expert(e) for m in (experts.gate, experts.up, experts.down)]
        for r in roundings:
            gate, up, down = (_rounded(w, "fp16" if r == "fp16" else None) for w in exact)
            a = xs[r][token]
            h = _rounded(F.silu(a @ gate.T) * (a @ up.T), r)
            ys[r].index_add_(0, token, (h @ down.T) * weight)
    return ys
