"""A step's inputs in one launch each: the token embedding's rows (embed_rows.py) against the gather and torch's
dequantization, the RoPE cos / sin rows (rope_cos_sin.py) against `Rope.cos_sin`'s torch ops."""

import numpy as np
import pytest
import torch

from strata.kernels.pointwise.embed_rows import embed_rows_triton
from strata.kernels.pointwise.rope_cos_sin import rope_cos_sin_triton
from strata.models import layers
from strata.models.layers import Rope
from strata.models.weights import QuantWeight
from strata.quant import quantize
from tests.kernels.pointwise.test_rms_norm_rope import DEVICE, _ulp

TYPES = {"F32": 0, "F16": 1, "BF16": 30, "Q4_0": 2, "Q8_0": 8}


def _embedding(name: str, vocab: int, cols: int) -> QuantWeight:
    rng = np.random.default_rng(cols)
    weights = rng.standard_normal((vocab, cols)).astype(np.float32) * 0.7
    raw = torch.from_numpy(quantize(weights, name).reshape(vocab, -1).copy()).to(DEVICE)
    return QuantWeight("token_embd.weight", TYPES[name], (vocab, cols), raw)


@pytest.mark.parametrize("name", list(TYPES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_embedding_rows_are_torchs_dequantized_rows(name, dtype):
    """Compiled (round to nearest even, as torch's conversion) the bytes are torch's; Triton's interpreter rounds to
    the dtype otherwise, a step at most."""
    embed = _embedding(name, 50, 96)
    ids = torch.tensor([[7, 0, 49], [7, 3, 21]], device=DEVICE)
    got = embed_rows_triton(embed.raw, embed.ggml_type, 96, ids, dtype)
    want = embed[ids].dequantize(dtype)
    assert got.shape == want.shape == (2, 3, 96) and got.dtype == dtype
    if DEVICE == "cuda":
        assert torch.equal(got, want)
    else:
        assert ((got.float() - want.float()).abs() <= _ulp(dtype) * want.float().abs()).all()


def test_rows_at_a_wider_stride():
    """The rows of a view whose row stride is wider than a row's bytes (a slice of a padded buffer)."""
    embed = _embedding("Q8_0", 10, 64)
    padded = torch.zeros(10, embed.raw.shape[1] + 14, dtype=torch.uint8, device=DEVICE)
    padded[:, :embed.raw.shape[1]] = embed.raw
    ids = torch.tensor([9, 2], device=DEVICE)
    got = embed_rows_triton(padded[:, :embed.raw.shape[1]], 8, 64, ids, torch.float16)
    want = embed[ids].dequantize(torch.float16)
    assert ((got.float() - want.float()).abs() <= _ulp(torch.float16) * want.float().abs()).all()


def test_other_formats_are_left_to_torch(monkeypatch):
    embed = _embedding("Q4_0", 8, 64)
    assert embed_rows_triton(embed.raw, 12, 64, torch.tensor([1], device=DEVICE), torch.bfloat16) is None  # Q4_K
    monkeypatch.setattr(layers, "FUSED_ON_CPU", True)
    k_quant = QuantWeight("token_embd.weight", 12, (8, 256), torch.zeros(8, 144, dtype=torch.uint8, device=DEVICE))
    rows = layers.embed_rows(k_quant, torch.tensor([2, 5], device=DEVICE), torch.bfloat16)  # torch's ops instead
    assert torch.equal(rows, k_quant[torch.tensor([2, 5], device=DEVICE)].dequantize(torch.bfloat16))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [128, 64, 96])
def test_rope_rows_are_torchs_to_a_rounding_step(dtype, head_dim):
    """The same float32 angles (up to position 2^19, where the angle is ~5e5 radians), cos and sin within an ulp of
    float32 of torch's before the rounding: at most a step of the dtype apart, compiled mostly none."""
    rope = Rope(head_dim, 1e6, torch.device(DEVICE))
    positions = torch.tensor([0, 1, 37, 4095, 65_537, 524_287], device=DEVICE)
    cos, sin = rope_cos_sin_triton(positions, rope.inv_freq, dtype)
    freqs = positions.float()[:, None] * rope.inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    for got, want in ((cos, emb.cos()), (sin, emb.sin())):
        assert got.shape == (6, head_dim) and got.dtype == dtype
        step = _ulp(dtype) * want.abs().clamp(min=2.0**-14)
        assert ((got.float() - want.to(dtype).float()).abs() <= step).all()
        if DEVICE == "cuda":  # (the interpreter's conversion to the dtype rounds otherwise: ~half a step off)
            assert (got == want.to(dtype)).float().mean().item() >= 0.95
    assert torch.equal(cos[0], torch.ones_like(cos[0])) and torch.equal(sin[0], torch.zeros_like(sin[0]))


def test_the_model_takes_the_kernel_on_the_gpu_path(monkeypatch):
    """`Rope.cos_sin` on a fused path (CUDA, or the CPU counting launches) is the kernel's; float32 stays torch's."""
    rope = Rope(64, 1e4, torch.device(DEVICE))
    positions = torch.tensor([3, 9], device=DEVICE)
    exact = rope.cos_sin(positions, torch.float32)
    freqs = positions.float()[:, None] * rope.inv_freq[None, :]
    assert torch.equal(exact[0], torch.cat((freqs, freqs), dim=-1).cos())
    monkeypatch.setattr(layers, "FUSED_ON_CPU", True)
    fused = rope.cos_sin(positions, torch.bfloat16)
    assert all(torch.equal(a, b) for a, b in zip(fused, rope_cos_sin_triton(positions, rope.inv_freq,
                                                                            torch.bfloat16)))
