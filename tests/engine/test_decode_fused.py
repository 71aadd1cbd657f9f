"""The decode step with its fused kernels (models/layers.py `_fused`: residual add + RMSNorm, the KV write, the
shared expert's gate, RoPE, routing; and the dense decode attention) taken on the CPU through Triton's interpreter,
as a GPU takes them: the static step (what the graphs capture) against step-by-step decode with the same kernels.
On a GPU machine Triton compiles for CUDA, not for CPU tensors: tools/device/decode_graphs_check.py checks there."""

import os

import pytest

from tests.engine.greedy_bf16 import greedy_bf16

PROMPT = [5, 17, 99, 3]
STEPS = 2  # bf16 on the CPU is slow (torch's bf16 matmuls): few tokens


@pytest.fixture(scope="module")
def tiny_next_bf16(model_dir):
    from strata.models.synthetic import make_model

    return make_model(model_dir / "tiny-qwen3next-fused.gguf", arch="qwen3next", preset="tiny", quant="Q8_0")


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="CPU tensors take Triton only interpreted")
def test_fused_static_step_agrees_with_step_by_step(tiny_next_bf16):
    """qwen3next runs every fused kernel qwen3moe does, and the shared expert's gate (one model: bf16 on the CPU is
    slow)."""
    static, tokens, got = greedy_bf16(tiny_next_bf16, True, PROMPT, STEPS, decode_graphs="eager")
    assert static.decoder is not None and static.decoder.steps == STEPS
    _, step_tokens, step_by_step = greedy_bf16(tiny_next_bf16, True, PROMPT, STEPS)
    assert tokens == step_tokens
    # bf16 activations: the static step attends through the decode kernel over the fp16 cache (step by step: SDPA
    # over this step's keys at full precision), and the interpreter rounds by truncation; a few bf16 steps apart.
    # (Each fused kernel against its torch form: tests/kernels/pointwise/test_fused_step_kernels.py.)
    assert (got - step_by_step).abs().max() <= 3e-2 * step_by_step.abs().max()
