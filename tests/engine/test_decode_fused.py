"""The decode step with its fused kernels (models/layers.py `_fused`: residual add + RMSNorm, the KV write, the
shared expert's gate, RoPE, routing; and the dense decode attention) taken on the CPU through Triton's interpreter,
as a GPU takes them: the static step (what the graphs capture) against step-by-step decode with the same kernels.
On a GPU machine Triton compiles for CUDA, not for CPU tensors: tools/device/decode_graphs_check.py checks there."""

import os

import pytest
import torch

from strata.engine.engine import Engine, EngineConfig
from strata.models import layers

PROMPT = [5, 17, 99, 3]
STEPS = 2  # bf16 on the CPU is slow (torch's bf16 matmuls): few tokens


@pytest.fixture(scope="module")
def tiny_next_bf16(model_dir):
    from strata.models.synthetic import make_model

    return make_model(model_dir / "tiny-qwen3next-fused.gguf", arch="qwen3next", preset="tiny", quant="Q8_0")


def _greedy(path, fused: bool, **options):
    """(tokens, logits of every step) of a greedy bf16 decode after PROMPT."""
    layers.FUSED_ON_CPU = fused
    try:
        engine = Engine(path, EngineConfig(device="cpu", dtype="bfloat16", **options))
        logits, tokens, out = engine.prefill(PROMPT), [], []
        for step in range(STEPS):
            tokens.append(int(logits[-1].argmax()))
            logits = engine.decode(tokens[-1], len(PROMPT) + step)
            out.append(logits.clone())
        return engine, tokens, torch.cat(out)
    finally:
        layers.FUSED_ON_CPU = False


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="CPU tensors take Triton only interpreted")
def test_fused_static_step_agrees_with_step_by_step(tiny_next_bf16):
    """qwen3next runs every fused kernel qwen3moe does, and the shared expert's gate (one model: bf16 on the CPU is
    slow)."""
    static, tokens, got = _greedy(tiny_next_bf16, True, decode_graphs="eager")
    assert static.decoder is not None and static.decoder.steps == STEPS
    _, step_tokens, step_by_step = _greedy(tiny_next_bf16, True)
    assert tokens == step_tokens
    # bf16 activations: the static step attends through the decode kernel over the fp16 cache (step by step: SDPA
    # over this step's keys at full precision), and the interpreter rounds by truncation; a few bf16 steps apart.
    # (Each fused kernel against its torch form: tests/kernels/pointwise/test_fused_step_kernels.py.)
    assert (got - step_by_step).abs().max() <= 3e-2 * step_by_step.abs().max()
