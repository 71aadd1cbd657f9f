"""STRATA_DECODE_CHAIN on the CPU (Triton's interpreter; the fused kernels, the quantized matvec and the one-shot
expert kernels taken by CPU tensors as a GPU takes them): a tiny qwen3moe's decode steps with each MoE layer's o
projection, routing, experts and closing add + norm chained in one launch give the unchained kernels' tokens and
logits byte for byte, in the step-by-step engine and through the graph seam's static step (its CPU form), and
every layer's counters are zero again after each launch."""

import os

import pytest
import torch

from strata import switches
from strata.engine import experts as backends
from strata.engine import static_kv
from strata.engine.engine import Engine, EngineConfig
from strata.kernels.moe import chain_moe, gemv
from strata.kernels.moe.decode import SPECS
from strata.kernels.quant.matvec import quant_matvec
from strata.models import decoder, layers, stacked_projections
from strata.models.weights import FLOAT_VIEWS
from strata.quant import get_format
from tests.engine.greedy_bf16 import greedy_bf16

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="CPU tensors take Triton only interpreted")]
PROMPT = [5, 17, 99, 3]
STEPS = 2


@pytest.fixture
def kernels_on_cpu(monkeypatch):
    """The GPU's decode path on CPU tensors: fused kernels, the expert kernels and the quantized matvec (one-shot
    tiles: the GPU's default for Q4_0, and what the chain runs), and a spy on the chained launches (the results
    they returned)."""
    monkeypatch.setattr(layers, "FUSED_ON_CPU", True)
    monkeypatch.setattr(backends, "kernel_path", lambda stack, x: "decode")
    monkeypatch.setattr(gemv, "use_triton", lambda t: True)
    monkeypatch.setattr(gemv, "gemv_config", lambda kind, spec, n_out, n_in, top_k, on_gpu:
                        gemv.oneshot_config(kind, spec, n_out, n_in, top_k, on_gpu))
    real_linear = decoder.linear

    def linear(x, weight, bias=None):  # models/weights.py's `linear`, with the GPU's quantized matvec on the CPU
        if (weight.ggml_type not in FLOAT_VIEWS and x.dtype != torch.float32 and x.dim() == 2 and x.shape[0] <= 4
                and get_format(weight.ggml_type).name in SPECS):
            y = quant_matvec(x, weight.raw, weight.ggml_type, weight.shape)
            return y if bias is None else y + bias
        return real_linear(x, weight, bias)

    monkeypatch.setattr(decoder, "linear", linear)  # the attention's o projection (the chain's first phase)
    monkeypatch.setattr(stacked_projections, "linear", linear)  # its stacked q/k/v
    launches = []
    real = chain_moe.chain_moe_triton

    def spy(*a, **k):  # (what the launch returned, whether it took the o projection)
        launches.append((real(*a, **k), k.get("heads") is not None))
        return launches[-1][0]

    monkeypatch.setattr(chain_moe, "chain_moe_triton", spy)
    real_qkv = static_kv.chain_qkv_store

    def qkv_spy(*a, **k):  # ("qkv", whether the q/k/v launch ran): the static step's attention half
        out = real_qkv(*a, **k)
        launches.append(("qkv", out is not None))
        return out

    monkeypatch.setattr(static_kv, "chain_qkv_store", qkv_spy)
    return launches


def _run(path, graphs: str):
    _, tokens, logits = greedy_bf16(path, True, PROMPT, STEPS, decode_graphs=graphs)
    return tokens, logits


@pytest.mark.parametrize("graphs", ["off", "eager"])
def test_chained_steps_give_the_unchained_bytes(tiny_moe, kernels_on_cpu, graphs):
    with switches.override(STRATA_DECODE_CHAIN=""):
        tokens, logits = _run(tiny_moe, graphs)
    assert not kernels_on_cpu
    with switches.override(STRATA_DECODE_CHAIN="1"):
        chained_tokens, chained_logits = _run(tiny_moe, graphs)
    layers_moe = 2  # the tiny preset's layers, every one MoE
    moe = [launch for launch in kernels_on_cpu if launch[0] != "qkv"]
    assert len(moe) >= layers_moe * (1 + STEPS)  # prompt (4 rows) and each step
    # Each launch with the o projection first (the prompt's 4 rows too) and the layer's add + norm last.
    assert all(out is not None and len(out) == 5 and folded for out, folded in moe)
    # The static step (graphs' CPU form) also chains each layer's q/k/v projection with its norm + RoPE + store.
    qkv = [ran for name, ran in kernels_on_cpu if name == "qkv"]
    assert all(qkv) and len(qkv) == (layers_moe * STEPS if graphs == "eager" else 0)
    assert chained_tokens == tokens
    assert torch.equal(chained_logits, logits)
    for (device, site), counters in chain_moe._counters.items():
        assert not counters.any(), site  # zeroed by each launch's last program, for the next one


@pytest.fixture(scope="module")
def tiny_next(model_dir):
    from strata.models.synthetic import make_model

    return make_model(model_dir / "tiny-qwen3next-chain.gguf", arch="qwen3next", preset="tiny", quant="Q8_0")


def test_a_layer_with_a_shared_expert_joins_after_the_launch(tiny_next, kernels_on_cpu):
    """qwen3next: its own attention (no o projection in the launch), a gated shared expert joined by the model after
    the chained routing and experts; the same bytes."""
    with switches.override(STRATA_DECODE_CHAIN=""):
        tokens, logits = _run(tiny_next, "eager")
    with switches.override(STRATA_DECODE_CHAIN="1"):
        chained_tokens, chained_logits = _run(tiny_next, "eager")
    moe = [launch for launch in kernels_on_cpu if launch[0] != "qkv"]
    assert moe and all(out is not None and len(out) == 3 and not folded for out, folded in moe)
    assert chained_tokens == tokens and torch.equal(chained_logits, logits)


def _windows(path) -> torch.Tensor:
    """Verify windows of 4, 2, 3 and 1 rows through the static step (engine/spec_windows.py): their logits."""
    engine = Engine(path, EngineConfig(device="cpu", dtype="bfloat16", spec=4, decode_graphs="eager"))
    assert engine.spec.windows is not None
    engine.prefill(PROMPT)
    start, out = len(PROMPT), []
    for window, keep in (([5, 6, 7, 8], 2), ([40, 41], 2), ([300, 301, 302], 1), ([77], 1)):
        out.append(engine.spec.verify(window, start).clone())
        engine.spec.keep(start, keep)
        start += keep
    return torch.cat(out)


def test_verify_windows_give_the_unchained_bytes(tiny_moe, kernels_on_cpu):
    """A window's rows (up to 4) through both chained launches: each row's logits as the unchained window's."""
    with switches.override(STRATA_DECODE_CHAIN=""):
        want = _windows(tiny_moe)
    with switches.override(STRATA_DECODE_CHAIN="1"):
        got = _windows(tiny_moe)
    assert torch.equal(got, want)
    assert ("qkv", True) in kernels_on_cpu and all(ran for name, ran in kernels_on_cpu if name == "qkv")
    moe = [out for out, folded in kernels_on_cpu if not isinstance(out, str)]
    assert all(moe) and {out[0].shape[0] for out in moe} >= {1, 2, 3, 4}  # the prompt's 4 rows and each window
