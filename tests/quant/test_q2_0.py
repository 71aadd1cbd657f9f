"""Q2_0 against a plain-Python reading of its definition, and its least-squares quantizer."""

import struct

import numpy as np
import torch

from strata.quant import dequantize, quantize, random_blocks

FACTORS = np.linspace(0.4, 1.1, 22)


def reference_dequantize(raw: bytes) -> list[float]:
    """fp16 d, then 16 bytes; weight j = d * (((qs[j // 4] >> 2 * (j % 4)) & 3) - 1)."""
    out = []
    for start in range(0, len(raw), 18):
        (d,) = struct.unpack("<e", raw[start : start + 2])
        qs = raw[start + 2 : start + 18]
        out += [d * (((qs[j // 4] >> (2 * (j % 4))) & 3) - 1) for j in range(64)]
    return out


def nearest_codes(w: np.ndarray, d: float) -> list[int]:
    return [min(max(round(x / d) + 1, 0), 3) if d else 1 for x in w.tolist()]


def candidate_error(w: np.ndarray, d: float) -> float:
    return sum((d * (c - 1) - x) ** 2 for c, x in zip(nearest_codes(w, d), w.tolist()))


def test_dequantize_matches_definition(device):
    rng = np.random.default_rng(0)
    blocks = random_blocks("Q2_0", 24, rng)
    blocks[:, :2] = rng.normal(0, 0.05, (24, 1)).astype(np.float16).view(np.uint8)  # negative d too
    ours = dequantize(torch.from_numpy(blocks).to(device), "Q2_0", (4, 6 * 64)).cpu().numpy()
    expected = np.array(reference_dequantize(blocks.tobytes()), dtype=np.float32).reshape(4, 6 * 64)
    assert np.array_equal(ours.view(np.uint32), expected.view(np.uint32))


def test_round_trip_error():
    w = np.random.default_rng(1).normal(0, 0.02, (16, 1024)).astype(np.float32)
    back = dequantize(torch.from_numpy(quantize(w, "Q2_0")), "Q2_0", w.shape).numpy()
    # 4 levels per weight: about a third of the signal's RMS is what 2 bits leave (0.35 measured).
    assert np.sqrt(((back - w) ** 2).mean() / (w**2).mean()) < 0.4


def test_chosen_scale_is_least_squares_best_candidate():
    rng = np.random.default_rng(2)
    w = (rng.normal(0, 1, (6, 64)) * rng.uniform(0.01, 3, (6, 1))).astype(np.float32)
    w[1] = np.abs(w[1])  # one-sided block: the sign of d matters
    raw = quantize(w, "Q2_0")
    for block, row in zip(raw, w):
        (d,) = struct.unpack("<e", block[:2].tobytes())
        amax = float(np.abs(row).max())
        candidates = [float(np.float16(s * f * amax / 2)) for s in (1, -1) for f in FACTORS]
        best = min(candidate_error(row, c) for c in candidates)
        assert d in candidates
        assert candidate_error(row, d) <= best * (1 + 1e-12)
        # The stored codes are the nearest ones under the stored d.
        assert reference_dequantize(block.tobytes()) == [d * (c - 1) for c in nearest_codes(row, d)]


def test_zero_block():
    raw = quantize(np.zeros((2, 64), np.float32), "Q2_0")
    assert raw.shape == (2, 18) and not raw[:, :2].any()
    assert not dequantize(torch.from_numpy(raw), "Q2_0", (2, 64)).any()
