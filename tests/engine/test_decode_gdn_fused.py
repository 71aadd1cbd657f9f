"""The GatedDeltaNet decode-step kernels (kernels/pointwise/gdn_conv_step.py, gdn_out_gate.py) inside a whole bf16
decode, taken on the CPU through Triton's interpreter as a GPU takes them: the same tokens as the torch path, the
logits and the conv states (written in place by the kernel) a few bf16 steps apart, for both hybrid models."""

import os

import pytest
import torch

from strata.models.synthetic import make_model
from tests.engine.greedy_bf16 import greedy_bf16

PROMPT = [5, 17, 99, 3]
STEPS = 2  # bf16 on the CPU is slow: few tokens


@pytest.fixture(scope="module", params=["qwen3next", "qwen4exp"])
def tiny_hybrid(request, tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("gdn-fused") / f"tiny-{request.param}.gguf", arch=request.param,
                      preset="tiny", quant="Q8_0")


def _greedy(path, fused: bool):
    """(tokens, logits of every step, the conv states) of a step-by-step greedy bf16 decode after PROMPT."""
    engine, tokens, logits = greedy_bf16(path, fused, PROMPT, STEPS)
    return tokens, logits, torch.stack([t.float() for _, t in sorted(engine.kv.conv.items())])


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="CPU tensors take Triton only interpreted")
def test_gdn_step_kernels_decode_as_torch_does(tiny_hybrid, monkeypatch):
    from strata.kernels.pointwise import gdn_conv_step, gdn_out_gate

    calls = []
    for module, name in ((gdn_conv_step, "conv_step_triton"), (gdn_out_gate, "out_gate_triton")):
        def counted(*args, _kernel=getattr(module, name), _name=name, **kwargs):
            calls.append(_name)
            return _kernel(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    tokens, got, conv = _greedy(tiny_hybrid, True)
    assert calls.count("conv_step_triton") > 0 and calls.count("out_gate_triton") > 0
    monkeypatch.undo()
    want_tokens, want, want_conv = _greedy(tiny_hybrid, False)
    assert tokens == want_tokens
    # Every fused kernel rounds where torch does, but the interpreter truncates and sums in another order: over a
    # whole model a few bf16 steps of the largest logit (the same bound as tests/engine/test_decode_fused.py).
    assert (got - want).abs().max() <= 3e-2 * want.abs().max()
    # The conv past holds projected inputs (no sums of the kernel's own): as close as the projections themselves.
    assert (conv - want_conv).abs().max() <= 3e-2 * want_conv.abs().max()
    assert conv.abs().max() > 0  # the kernel did write the past
