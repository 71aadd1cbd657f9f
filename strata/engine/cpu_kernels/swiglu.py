"""One layer's missed experts on the CPU in one call: fused gate/up + SwiGLU over all experts, then down."""

from __future__ import annotations

import numpy as np
import torch
from numba import njit
import torch.nn.functional as F

from strata.engine.cpu_kernels.blocks import FORMATS
from strata import switches
from strata.engine.cpu_kernels.gemv import (Scratch, gate_up_pairs, gemv_pairs, quantize_for, quantize_simd, simd_gate_up_pairs,
                                            simd_gemv_pairs, simd_groups, simd_supported, supported)
from strata.errors import StrataError
from strata.models.weights import QuantWeight
from strata.quant import get_format


_SCRATCH = Scratch()


class HostExperts:
    """A layer's stacked gate/up [E, ff, embd] and down [E, embd, ff] as numpy views of their bytes (no copy)."""

    def __init__(self, gate: QuantWeight, up: QuantWeight, down: QuantWeight):
        for m in (gate, up, down):
            if m.shape[-1] % get_format(m.ggml_type).block_size:  # the kernels read whole blocks only
                raise StrataError(f"{m.name}: rows of {m.shape[-1]} are not whole {get_format(m.ggml_type).name} blocks")
        self.mats = (gate, up, down)
        self.views = tuple(m.raw.reshape(m.shape[0], m.shape[1], -1).numpy() for m in self.mats)
        self.types = tuple(int(m.ggml_type) for m in self.mats)
        self.fast_gate_up = supported(self.types[0]) and supported(self.types[1])
        self.fast_down = supported(self.types[2])
        # The SIMD kernels take a layer whose three formats they all read and whose gate and up share activation
        # groups (one quantized copy of x serves both): `simd` is their activation width, or None for the `blocks`
        # kernels (STRATA_CPU_POOL_OLD, or a layer they do not take).
        self.simd = None
        if (not switches.get("STRATA_CPU_POOL_OLD") and all(simd_supported(t) for t in self.types)
                and simd_groups(self.types[0]) == simd_groups(self.types[1])):
            self.simd = "i8" if switches.get("STRATA_CPU_POOL_INT8") else "i16"

    def _torch_rows(self, which: int, x: np.ndarray, experts, pair_start, x_rows) -> np.ndarray:
        """The fallback for a format without a block kernel: dequantize each expert's matrix, multiply in float32."""
        w = self.mats[which]
        y = np.empty((len(x_rows), w.shape[1]), np.float32)
        for j, e in enumerate(experts):
            p = slice(pair_start[j], pair_start[j + 1])
            y[p] = (torch.from_numpy(x[x_rows[p]]) @ w[e].dequantize().T).numpy()
        return y

    def swiglu(self, x: np.ndarray, experts, pair_start, x_rows) -> np.ndarray:
        """float32 [P, embd]: expert(x[x_rows[p]]) for every pair p, grouped by expert as in `gemv_pairs`."""
        (w_gate, w_up, w_down), (t_gate, t_up, t_down) = self.views, self.types
        if self.simd:  # codes of x, h and u in this thread's reused buffers; the result is new
            act = quantize_simd(t_gate, x, self.simd, _SCRATCH)
            h = simd_gate_up_pairs(t_gate, w_gate, t_up, w_up, act, experts, pair_start, x_rows, _SCRATCH)
            return simd_gemv_pairs(t_down, w_down, quantize_simd(t_down, h, self.simd, _SCRATCH), experts, pair_start,
                                   np.arange(len(x_rows)))
        if self.fast_gate_up:
            act_gate = quantize_for(t_gate, x)
            act_up = act_gate if FORMATS[t_gate][1:] == FORMATS[t_up][1:] else quantize_for(t_up, x)
            h = gate_up_pairs(t_gate, w_gate, act_gate, t_up, w_up, act_up, experts, pair_start, x_rows)
        else:
            g = torch.from_numpy(self._torch_rows(0, x, experts, pair_start, x_rows))
            u = torch.from_numpy(self._torch_rows(1, x, experts, pair_start, x_rows))
            h = (F.silu(g) * u).numpy()
        own = np.arange(len(x_rows))
        if self.fast_down:
            return gemv_pairs(t_down, w_down, quantize_for(t_down, h), experts, pair_start, own)
        return self._torch_rows(2, h, experts, pair_start, own)


def pairs_of(routes: dict, weights: torch.Tensor, experts: list[int]):
    """The (expert, token) pairs of `experts` from routes {expert: (token rows, top-k slot)}: experts, pair_start,
    token of each pair, routing weight of each pair."""
    tokens = [routes[e][0] for e in experts]
    slots = [routes[e][1] for e in experts]
    pair_start = np.zeros(len(experts) + 1, np.int64)
    pair_start[1:] = np.cumsum([len(t) for t in tokens])
    token = torch.cat(tokens) if tokens else torch.zeros(0, dtype=torch.long)
    slot = torch.cat(slots) if slots else torch.zeros(0, dtype=torch.long)
    return np.asarray(experts, np.int64), pair_start, token, weights[token, slot].float()


def moe_experts(host: HostExperts, x: torch.Tensor, routes: dict, weights: torch.Tensor, experts: list[int]) -> torch.Tensor:
    """sum over each token's experts among `experts` of weight * expert(x), float32 [T, embd] (CPU tensors)."""
    x = x.float().contiguous()
    out = torch.zeros_like(x)
    if not experts:
        return out
    ids, pair_start, token, w = pairs_of(routes, weights, experts)
    token = token.numpy()
    y = host.swiglu(x.numpy(), ids, pair_start, token)
    # Not torch's index_add_: from the pool's thread its OpenMP region waits on threads numba's kernels keep busy
    # (68 ms a call measured on 2 cores); a plain loop adds the pairs in the same order.
    add_weighted_rows(out.numpy(), token, y, w.numpy())
    return out


@njit(nogil=True, cache=True)
def add_weighted_rows(out, rows, y, w):
    """out[rows[p]] += y[p] * w[p] for every pair p, in order (float32)."""
    for p in range(rows.shape[0]):
        for j in range(y.shape[1]):
            out[rows[p], j] += y[p, j] * w[p]
