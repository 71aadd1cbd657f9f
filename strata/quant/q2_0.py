"""Strata's Q2_0: 64 weights in 18 bytes, an fp16 d then 2-bit codes c with weight = d * (c - 1)."""

import numpy as np
import torch

from strata.quant.fields import fp16_at, interleaved

_FACTORS = np.linspace(0.4, 1.1, 22)
# Candidate d = sign * f * amax / 2, every f with each sign, tried in this order (the first best wins a tie).
_CANDIDATES = np.concatenate([_FACTORS, -_FACTORS]) / 2


def q2_0(blocks: torch.Tensor) -> torch.Tensor:
    return fp16_at(blocks, 0) * (interleaved(blocks[:, 2:18], 2).float() - 1)


def codes_for(x: np.ndarray, d: np.ndarray) -> np.ndarray:
    """The nearest codes 0..3 of weights x [n, 64] under scales d [n, 1]; a zero d gives code 1 (weight 0)."""
    ratio = np.divide(x, d, out=np.zeros_like(x), where=d != 0)
    return np.clip(np.round(ratio) + 1, 0, 3)


def quantize_q2_0(blocks: np.ndarray) -> np.ndarray:
    """float32 [n, 64] -> uint8 [n, 18]: per block, the least-squares d among the candidates."""
    x = blocks.astype(np.float64)
    amax = np.abs(x).max(axis=-1, keepdims=True)
    best_d = np.zeros_like(amax)
    best_err = np.full_like(amax, np.inf)
    for c in _CANDIDATES:
        # Judge each candidate as stored: d rounded to fp16.
        d = (c * amax).astype(np.float16).astype(np.float64)
        err = ((d * (codes_for(x, d) - 1) - x) ** 2).sum(axis=-1, keepdims=True)
        better = err < best_err
        best_d = np.where(better, d, best_d)
        best_err = np.where(better, err, best_err)
    codes = codes_for(x, best_d).astype(np.uint8).reshape(-1, 16, 4)
    packed = codes[..., 0] | (codes[..., 1] << 2) | (codes[..., 2] << 4) | (codes[..., 3] << 6)
    return np.concatenate([best_d.astype(np.float16).view(np.uint8), packed], axis=-1)
