"""Our logits against transformers' on the same GGUF-exported tiny models: the oracle nobody here wrote."""

import pytest
import torch

import strata
from tools.export_hf import dequantized_hf_model

ARCHS = ["qwen2", "qwen3", "qwen3moe"]
N_TOKENS = 64


def _tokens(vocab: int, n: int = N_TOKENS, seed: int = 0) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _relative_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tied", [False, True])
def test_f32_logits_match_transformers(hf_exports, arch, tied):
    model, path = hf_exports.get(arch, "F32", tied)
    ids = _tokens(model.config.vocab_size)
    ours = strata.LLM(path, device="cpu").logits(ids)
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].float()
    assert ours.shape == ref.shape == (N_TOKENS, model.config.vocab_size)
    assert _relative_error(ours, ref) < 1e-4
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K", "Q2_0"])
def test_quantized_logits_match_transformers_on_the_dequantized_weights(hf_exports, arch, qtype):
    model, path = hf_exports.get(arch, qtype)
    reference = dequantized_hf_model(model, qtype)
    ids = _tokens(model.config.vocab_size)
    ours = strata.LLM(path, device="cpu").logits(ids)
    with torch.no_grad():
        ref = reference(torch.tensor([ids])).logits[0].float()
        unquantized = model(torch.tensor([ids])).logits[0].float()
    # Same effective weights: only float32 rounding separates us from transformers...
    assert _relative_error(ours, ref) < 1e-4
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))
    # ...while the quantization itself moves the logits by much more (the test can see a wrong dequantizer).
    assert _relative_error(ours, unquantized) > 10 * _relative_error(ours, ref)


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_generation_matches_transformers(hf_exports, arch):
    """The decode path (one token at a time through the KV cache) against transformers' generate."""
    model, path = hf_exports.get(arch, "F32")
    prompt = _tokens(model.config.vocab_size, 12, seed=3)
    llm = strata.LLM(path, device="cpu", kv_dtype="float32")
    ours = llm.generate(prompt, max_tokens=20, temperature=0).token_ids
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
    theirs = out[0, len(prompt):].tolist()
    # Our run stops at the first end-of-text id; compare the part both produced.
    assert len(ours) >= 1 and ours == theirs[: len(ours)]
