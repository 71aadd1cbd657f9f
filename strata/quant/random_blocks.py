"""Valid random blocks of every format, for synthetic models and tests: random codes under finite scales."""

import numpy as np
import torch

from strata.quant.kquant_encode import pack_scale_min_k4
from strata.quant.registry import dequantize, get_format, quantize

_SAMPLE_BLOCKS = 1024  # blocks dequantized to measure the spread before the final scaling

# fp16 fields set to (multiplier * d), by byte offset. A negative or larger second field is the block's offset,
# chosen so the mean code maps near zero (Q4_1: d*q + m with q in 0..15; Q4_K: d*sc*q - dmin*m with m = sc).
_FP16_FIELDS = {
    "Q4_0": {0: 1.0},
    "Q4_1": {0: 1.0, 2: -7.5},
    "Q5_0": {0: 1.0},
    "Q5_1": {0: 1.0, 2: -15.5},
    "Q8_0": {0: 1.0},
    "Q2_K": {80: 1.0, 82: 1.5},
    "Q3_K": {108: 1.0},
    "Q4_K": {0: 1.0, 2: 7.5},
    "Q5_K": {0: 1.0, 2: 15.5},
    "Q6_K": {208: 1.0},
    "IQ1_S": {0: 1.0},
    "IQ2_XXS": {0: 1.0},
    "IQ2_XS": {0: 1.0},
    "IQ2_S": {0: 1.0},
    "IQ3_XXS": {0: 1.0},
    "IQ3_S": {0: 1.0},
    "IQ4_NL": {0: 1.0},
    "IQ4_XS": {0: 1.0},
    "Q2_0": {0: 1.0},
}


def _center_mins(name: str, blocks: np.ndarray, rng: np.random.Generator) -> None:
    """Give k-quant sub-blocks a min equal to their scale, so that with the dmin above they centre on zero."""
    if name == "Q2_K":
        sc = blocks[:, 0:16] & 15
        blocks[:, 0:16] = sc | (sc << 4)
    elif name in ("Q4_K", "Q5_K"):
        sc = rng.integers(0, 64, (blocks.shape[0], 8))
        blocks[:, 4:16] = pack_scale_min_k4(sc, sc)


def _set_scale(name: str, blocks: np.ndarray, d: np.ndarray) -> None:
    """Write per-block scale d [n] into the scale fields of `name`, the only fields the output is linear in."""
    if name == "MXFP4":
        # An e8m0 byte e scales by 2^(e - 128); 2..254 keeps every weight a finite normal float32.
        blocks[:, 0] = np.clip(128 + np.round(np.log2(d)), 2, 254).astype(np.uint8)
    elif name == "IQ1_M":
        # The fp16 d lives in the top nibbles of the four uint16 words at byte 48, lowest nibble first.
        bits = d.astype(np.float16).view(np.uint16)
        words = blocks[:, 48:56].copy().view(np.uint16)
        for i in range(4):
            words[:, i] = (words[:, i] & 0x0FFF) | (((bits >> (4 * i)) & 15) << 12)
        blocks[:, 48:56] = words.view(np.uint8)
    else:
        for offset, mult in _FP16_FIELDS[name].items():
            blocks[:, offset : offset + 2] = (mult * d).astype(np.float16).view(np.uint8).reshape(-1, 2)


def random_blocks(qtype: int | str, n_blocks: int, rng: np.random.Generator, scale: float = 0.02) -> np.ndarray:
    """uint8 [n_blocks, type_size] of valid blocks whose weights have a standard deviation near `scale`."""
    fmt = get_format(qtype)
    if fmt.block_size == 1:  # plain floats: draw the weights themselves
        return quantize(rng.normal(0, scale, (n_blocks, 1)), fmt.ggml_type)
    blocks = rng.integers(0, 256, (n_blocks, fmt.type_size), dtype=np.uint8)
    _center_mins(fmt.name, blocks, rng)
    spread = np.exp(rng.normal(0, 0.25, n_blocks))  # blocks differ in scale, as real ones do
    _set_scale(fmt.name, blocks, spread)
    sample = torch.from_numpy(blocks[:_SAMPLE_BLOCKS])
    std = dequantize(sample, fmt.ggml_type, (sample.shape[0], fmt.block_size)).std().item()
    _set_scale(fmt.name, blocks, spread * scale / (std or 1.0))  # `or`: a sample of all-zero codes
    return blocks
