"""The hyper-connection read kernels (kernels/hc) inside a whole bf16 qwen4exp decode on the CPU, through Triton's
interpreter as a GPU takes them: every read of a step (two a layer and the head's) is one hc_read_triton call, and
the tokens and logits are the torch path's within a few bf16 steps."""

import os

import pytest

from strata.models.synthetic import make_model
from tests.engine.greedy_bf16 import greedy_bf16

PROMPT = [5, 17, 99, 3, 250]  # past MAX_ROWS: the prompt's layers keep the torch reference
STEPS = 2  # bf16 on the CPU is slow: few tokens


@pytest.fixture(scope="module")
def tiny_qwen4exp(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("hc-fused") / "tiny-qwen4exp.gguf", arch="qwen4exp", preset="tiny",
                      quant="Q8_0")


def _greedy(path, fused: bool):
    engine, tokens, logits = greedy_bf16(path, fused, PROMPT, STEPS)
    return tokens, logits, engine.model.n_main


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="CPU tensors take Triton only interpreted")
def test_hc_kernels_decode_as_torch_does(tiny_qwen4exp, monkeypatch):
    import strata.kernels.hc.read as read

    calls = []
    kernel = read.hc_read_triton
    monkeypatch.setattr(read, "hc_read_triton", lambda *a, **k: calls.append(a[0].shape[0]) or kernel(*a, **k))
    tokens, got, n_layers = _greedy(tiny_qwen4exp, True)
    # The prompt's layers (5 rows) keep torch, its head reads the last row; each decode step reads twice a layer
    # and once for the head, one row each.
    assert calls == [1] * (1 + STEPS * (2 * n_layers + 1))
    monkeypatch.undo()
    want_tokens, want, _ = _greedy(tiny_qwen4exp, False)
    assert tokens == want_tokens
    # The kernels sum in another order and the interpreter truncates to bf16: over a whole model a few bf16 steps
    # of the largest logit (the bound of tests/engine/test_decode_fused.py).
    assert (got - want).abs().max() <= 3e-2 * want.abs().max()
