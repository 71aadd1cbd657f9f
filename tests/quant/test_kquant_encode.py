"""Our Q4_K/Q5_K/Q6_K quantizers: close round trips, better than a plain min/max or absmax choice, valid bytes."""

import gguf
import gguf.quants
import numpy as np
import pytest
import torch

from strata.quant import dequantize, get_format, quantize

# Relative RMSE bound on Gaussian rows (measured: Q4_K 0.072, Q5_K 0.036, Q6_K 0.017).
BOUNDS = {"Q4_K": 0.08, "Q5_K": 0.04, "Q6_K": 0.02}


def gaussian_rows() -> np.ndarray:
    rng = np.random.default_rng(0)
    # Rows of different magnitudes, like the rows of a real weight matrix.
    return (rng.normal(0, 1, (12, 1024)) * rng.uniform(0.005, 0.05, (12, 1))).astype(np.float32)


def rel_rmse(approx: np.ndarray, w: np.ndarray) -> float:
    return float(np.sqrt(((approx - w) ** 2).mean() / (w**2).mean()))


def plain_choice(w: np.ndarray, name: str) -> np.ndarray:
    """The simple encoding, with unrounded sub-block scales: min/max for Q4_K/Q5_K, absmax for Q6_K."""
    if name == "Q6_K":
        x = w.reshape(-1, 16)
        peak = np.take_along_axis(x, np.abs(x).argmax(-1)[:, None], -1)
        s = peak / -32
        return (s * np.clip(np.round(x / s), -32, 31)).reshape(w.shape)
    nmax = 15 if name == "Q4_K" else 31
    x = w.reshape(-1, 32)
    lo = np.minimum(x.min(-1, keepdims=True), 0)
    s = (x.max(-1, keepdims=True) - lo) / nmax
    return (s * np.clip(np.round((x - lo) / s), 0, nmax) + lo).reshape(w.shape)


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_round_trip(name):
    w = gaussian_rows()
    raw = quantize(w, name)
    assert raw.dtype == np.uint8 and raw.shape == (12, 4 * get_format(name).type_size)
    back = dequantize(torch.from_numpy(raw), name, w.shape).numpy()
    assert rel_rmse(back, w) < BOUNDS[name]
    assert rel_rmse(back, w) <= rel_rmse(plain_choice(w, name), w)
    # The bytes are a valid encoding: gguf-py reads the same weights from them.
    ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[name])
    assert np.array_equal(back, ref)


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_degenerate_blocks(name):
    w = np.zeros((4, 256), np.float32)
    w[1] = 0.01  # constant positive: the min cannot go above zero
    w[2] = -0.01
    w[3, 7] = 0.5  # one spike
    back = dequantize(torch.from_numpy(quantize(w, name)), name, w.shape).numpy()
    assert np.isfinite(back).all()
    assert not back[0].any()
    assert np.abs(back - w).max() < 0.02 * 0.5
