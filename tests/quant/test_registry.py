"""The registry's look-ups, sizes and one-line errors; quantize for the formats gguf-py encodes; random blocks."""


import gguf
import gguf.quants
import numpy as np
import pytest
import torch

from strata.errors import StrataError
from strata.quant import FORMATS, dequantize, get_format, quantize, random_blocks

GGUF_ENCODED = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]


def test_sizes_and_ids_agree_with_gguf():
    for fmt in FORMATS.values():
        if fmt.name == "Q2_0":
            assert (fmt.ggml_type, fmt.block_size, fmt.type_size) == (42, 64, 18)
            continue
        qtype = gguf.GGMLQuantizationType[fmt.name]
        assert fmt.ggml_type == qtype
        assert (fmt.block_size, fmt.type_size) == gguf.GGML_QUANT_SIZES[qtype]


def test_lookup_by_id_name_and_enum():
    q4k = get_format(12)
    assert q4k.name == "Q4_K"
    assert get_format("q4_k") is q4k and get_format(gguf.GGMLQuantizationType.Q4_K) is q4k
    assert get_format("Q2_0") is get_format(42)


def test_unknown_type():
    with pytest.raises(StrataError, match=r"^unsupported quant type 99 \(known: F32, F16, BF16, Q4_0, .*Q2_0\)$"):
        get_format(99)
    with pytest.raises(StrataError, match="unsupported quant type Q8_K"):
        dequantize(torch.zeros(292, dtype=torch.uint8), gguf.GGMLQuantizationType.Q8_K, (256,))


def test_wrong_byte_count():
    with pytest.raises(StrataError, match=r"Q4_K tensor of shape \(2, 512\) needs 576 bytes, got 575"):
        dequantize(torch.zeros(575, dtype=torch.uint8), "Q4_K", (2, 512))
    with pytest.raises(StrataError, match="multiple of 256"):
        dequantize(torch.zeros(144, dtype=torch.uint8), "Q4_K", (1, 200))


def test_no_quantizer():
    with pytest.raises(StrataError, match="^no quantizer for IQ2_XXS$"):
        quantize(np.zeros((1, 256), np.float32), "IQ2_XXS")


@pytest.mark.parametrize("name", GGUF_ENCODED)
def test_quantize_with_gguf(name):
    w = np.random.default_rng(0).normal(0, 0.02, (3, 2, 64)).astype(np.float32)
    raw = quantize(w, name)
    fmt = get_format(name)
    assert raw.dtype == np.uint8 and raw.shape == (3, 2, 64 // fmt.block_size * fmt.type_size)
    back = dequantize(torch.from_numpy(raw), name, w.shape).numpy()
    assert np.array_equal(back, gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[name]))
    assert np.abs(back - w).max() < 0.1 * np.abs(w).max()


@pytest.mark.parametrize("name", [f.name for f in FORMATS.values()])
def test_random_blocks(name):
    fmt = get_format(name)
    blocks = random_blocks(name, 300, np.random.default_rng(0), scale=0.05)
    assert blocks.dtype == np.uint8 and blocks.shape == (300, fmt.type_size)
    assert np.array_equal(blocks, random_blocks(name, 300, np.random.default_rng(0), scale=0.05))
    w = dequantize(torch.from_numpy(blocks), name, (300, fmt.block_size))
    assert torch.isfinite(w).all()
    assert 0.05 / 1.5 < w.std().item() < 0.05 * 1.5


@pytest.mark.parametrize("name", ["F32", "F16", "BF16"])
def test_float_encoders_write_the_bytes_gguf_writes(name):
    """The one-pass encoders equal gguf-py's, ties to even and NaN included."""
    rng = np.random.default_rng(3)
    values = np.concatenate([rng.standard_normal(4096).astype(np.float32) * 10.0 ** rng.integers(-8, 4, 4096),
                             np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1 + 2**-8, 1 + 3 * 2**-8, 65504, 1e-8],
                                      dtype=np.float32)]).astype(np.float32)[:, None]
    ours = get_format(name).quantize_blocks(values)
    theirs = gguf.quants.quantize(values, gguf.GGMLQuantizationType[name]).view(np.uint8)
    assert np.array_equal(ours.reshape(-1), theirs.reshape(-1))
