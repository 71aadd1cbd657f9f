"""Our torch dequantization against gguf-py's numpy reference: bit-identical, on every device we have."""

import gguf
import gguf.quants
import numpy as np
import pytest
import torch

from strata.quant import FORMATS, dequantize, random_blocks
from strata.quant.tables import sign_patterns

GGUF_NAMES = [f.name for f in FORMATS.values() if f.name != "Q2_0"]

# Byte offsets of each format's fp16 scale fields, from ggml's block structs (IQ1_M and MXFP4 are handled apart).
FP16_FIELDS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
    "IQ1_S": [0], "IQ2_XXS": [0], "IQ2_XS": [0], "IQ2_S": [0], "IQ3_XXS": [0], "IQ3_S": [0],
    "IQ4_NL": [0], "IQ4_XS": [0],
}  # fmt: skip


def shapes(block_size: int) -> list[tuple[int, ...]]:
    return [(1, block_size), (4, 3 * block_size), (7, 8 * block_size), (2, 3, 2 * block_size)]


def raw_blocks(name: str, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """Uniformly random bytes, with every fp16 scale overwritten by a small finite value."""
    fmt = FORMATS[gguf.GGMLQuantizationType[name]]
    blocks = rng.integers(0, 256, (n_blocks, fmt.type_size), dtype=np.uint8)
    small = lambda: rng.normal(0, 0.01, n_blocks).astype(np.float16)  # noqa: E731
    for offset in FP16_FIELDS.get(name, []):
        blocks[:, offset : offset + 2] = small().view(np.uint8).reshape(-1, 2)
    if name == "IQ1_M":  # fp16 d spread over the top nibbles of the 4 uint16 words at byte 48
        bits = small().view(np.uint16)
        words = blocks[:, 48:56].copy().view(np.uint16)
        for i in range(4):
            words[:, i] = (words[:, i] & 0x0FFF) | (((bits >> (4 * i)) & 15) << 12)
        blocks[:, 48:56] = words.view(np.uint8)
    return blocks


def check_against_gguf(name: str, blocks: np.ndarray, shape: tuple[int, ...], device: str) -> None:
    ours = dequantize(torch.from_numpy(blocks).to(device), name, shape)
    assert ours.dtype == torch.float32 and ours.device.type == device and tuple(ours.shape) == shape
    ref = np.asarray(gguf.quants.dequantize(blocks.reshape(*shape[:-1], -1), gguf.GGMLQuantizationType[name]))
    ours = ours.cpu().numpy()
    # Bit patterns equal; only NaNs (from raw bytes of the float formats) may differ in payload: CUDA quiets them.
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(ours), nan)
    assert np.array_equal(ours[~nan].view(np.uint32), ref[~nan].view(np.uint32))


@pytest.mark.parametrize("name", GGUF_NAMES)
def test_random_blocks_match_gguf(name, device):
    rng = np.random.default_rng(1)
    block_size = FORMATS[gguf.GGMLQuantizationType[name]].block_size
    for shape in shapes(block_size):
        n_blocks = int(np.prod(shape)) // block_size
        check_against_gguf(name, random_blocks(name, n_blocks, rng), shape, device)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # MXFP4's top exponents reach inf
@pytest.mark.parametrize("name", GGUF_NAMES)
def test_raw_random_bytes_match_gguf(name, device):
    rng = np.random.default_rng(2)
    block_size = FORMATS[gguf.GGMLQuantizationType[name]].block_size
    for shape in shapes(block_size):
        n_blocks = int(np.prod(shape)) // block_size
        check_against_gguf(name, raw_blocks(name, n_blocks, rng), shape, device)


def test_sign_patterns_match_gguf():
    expected = np.frombuffer(gguf.quants.IQ2_XXS.ksigns, dtype=np.uint8)
    bits = (expected[:, None] >> np.arange(8)) & 1
    assert np.array_equal(sign_patterns(), 1 - 2 * bits.astype(np.float32))


def test_any_raw_shape_and_layout(device):
    rng = np.random.default_rng(3)
    blocks = random_blocks("Q4_K", 6, rng)
    flat = dequantize(torch.from_numpy(blocks.reshape(-1)).to(device), "Q4_K", (3, 512))
    rows = dequantize(torch.from_numpy(blocks.reshape(3, -1)).to(device), "Q4_K", (3, 512))
    assert torch.equal(flat, rows)
    # Bytes starting at an odd address (a tensor carved out of a file buffer) read the same.
    padded = torch.from_numpy(np.concatenate([[0], blocks.reshape(-1)]).astype(np.uint8)).to(device)
    assert torch.equal(dequantize(padded[1:], "Q4_K", (3, 512)), rows)
