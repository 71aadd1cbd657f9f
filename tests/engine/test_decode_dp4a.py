"""STRATA_DP4A on the CPU (Triton's interpreter, the GPU's fused kernels taken by CPU tensors, PDL's launch options
forced on): a tiny Q4_0 qwen3moe's decode steps run its q/k/v, o, experts' gate/up and down through the dp4a GEMVs
(models/dp4a_step.py), the norms before q/k/v and the experts writing the codes those read, in the step-by-step
engine and through the graph seam's static step (its CPU form); unset, nothing of it runs.

Bound: each dp4a matvec is within `dp4a_gemv.row_error_bound` of the float product, at these widths (32-64, one or
two blocks a row) up to 3-4 % of a row's largest value in the worst case (typically 0.5 %); six of them in series
in each of the two layers move the logits of the first two steps by at most 5 % of the largest logit (measured:
0.9 % over three steps, 3.8 % by the 16th; greedy tokens: 16 of the first 16 equal)."""

import os

import pytest
import torch

from strata import switches
from strata.engine.engine import Engine, EngineConfig
from strata.kernels import pdl
from strata.kernels.moe import dp4a_gemv
from strata.kernels.pointwise import add_norm_route, add_rms_norm, rms_norm
from strata.models import layers
from tests.engine.greedy_bf16 import greedy_bf16

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="CPU tensors take Triton only interpreted")]
PROMPT = [5, 17, 99, 3, 44, 8]  # over dp4a_step.MAX_ROWS rows: the prompt keeps the current path
STEPS = 2
LAYERS = 2  # the tiny preset's, every one MoE
BOUND = 0.05  # of the largest logit (the module's docstring)


@pytest.fixture(scope="module")
def tiny_q4_0(model_dir):
    from strata.models.synthetic import make_model

    return make_model(model_dir / "tiny-qwen3moe-q4_0.gguf", arch="qwen3moe", preset="tiny", quant="Q4_0")


@pytest.fixture
def spied(monkeypatch):
    """The GPU's decode path on CPU tensors with PDL's options, and counts: each dp4a entry point's calls, and the
    norm launches given code buffers."""
    monkeypatch.setattr(layers, "FUSED_ON_CPU", True)
    monkeypatch.setattr(pdl, "FORCE_ON_CPU", True)
    calls = {"rounded norms": 0}
    for name in ("dp4a_matvec", "dp4a_gate_up", "dp4a_down", "quantize_x"):
        real = getattr(dp4a_gemv, name)

        def spy(*a, _real=real, _name=name, **k):
            calls[_name] = calls.get(_name, 0) + 1
            assert _name == "quantize_x" or k.get("pdl")  # the step's launches take STRATA_PDL's options
            return _real(*a, **k)

        monkeypatch.setattr(dp4a_gemv, name, spy)
    real_options = add_rms_norm.rounded_options

    def options(rounded):
        calls["rounded norms"] += rounded is not None
        return real_options(rounded)

    monkeypatch.setattr(add_rms_norm, "rounded_options", options)
    monkeypatch.setattr(add_norm_route, "rounded_options", options)
    monkeypatch.setattr(rms_norm, "rounded_options", options)
    return calls


def _run(path, graphs: str):
    _, tokens, logits = greedy_bf16(path, True, PROMPT, STEPS, decode_graphs=graphs)
    return tokens, logits.float()


@pytest.mark.parametrize("graphs", ["off", "eager"])
def test_dp4a_step_runs_its_kernels_within_the_bound(tiny_q4_0, spied, graphs):
    with switches.override(STRATA_DP4A=False, STRATA_PDL=1):
        tokens, logits = _run(tiny_q4_0, graphs)
    assert spied == {"rounded norms": 0}  # unset: no dp4a launch, no norm given code buffers
    with switches.override(STRATA_DP4A=True, STRATA_PDL=1):
        dp4a_tokens, dp4a_logits = _run(tiny_q4_0, graphs)
    # Each step: q/k/v and o of each layer, its experts; the norms' codes serve every q/k/v (layer 0's: the plain
    # rms_norm's) and every layer's experts, the gate/up epilogue H's, so quantize_x rounds only each o input.
    assert spied == {"dp4a_matvec": 2 * LAYERS * STEPS, "dp4a_gate_up": LAYERS * STEPS,
                     "dp4a_down": LAYERS * STEPS, "quantize_x": LAYERS * STEPS,
                     "rounded norms": 2 * LAYERS * STEPS}
    assert (dp4a_logits - logits).abs().max() <= BOUND * logits.abs().max()
    assert not torch.equal(dp4a_logits, logits)  # the dp4a path really changed the sums
    assert dp4a_tokens[0] == tokens[0]  # the prompt's own path: the same first token


@pytest.mark.parametrize("parts", ["qkv", "o,experts"])
def test_its_parts_switch_takes_only_those_matvecs(tiny_q4_0, spied, parts):
    """STRATA_DP4A_PARTS: the dp4a GEMVs of the parts named, the float kernels for the rest; the norms write codes
    only for a dp4a reader (q/k/v: every layer's; experts: every MoE layer's), o's input rounded by quantize_x."""
    with switches.override(STRATA_DP4A=True, STRATA_DP4A_PARTS=parts, STRATA_PDL=1):
        _run(tiny_q4_0, "eager")
    named = parts.split(",")
    want = {"rounded norms": LAYERS * STEPS * (("qkv" in named) + ("experts" in named))}
    matvecs = LAYERS * STEPS * (("qkv" in named) + ("o" in named))
    want.update({"dp4a_matvec": matvecs} if matvecs else {})
    want.update({"quantize_x": LAYERS * STEPS} if "o" in named else {})
    want.update({"dp4a_gate_up": LAYERS * STEPS, "dp4a_down": LAYERS * STEPS} if "experts" in named else {})
    assert spied == want
    with switches.override(STRATA_DP4A=True, STRATA_DP4A_PARTS="qkv,attention"):
        from strata.errors import StrataError
        from strata.models import dp4a_step

        with pytest.raises(StrataError, match="STRATA_DP4A_PARTS=qkv,attention: attention is not one of"):
            dp4a_step.takes("o")


def test_a_windows_rows_are_its_one_row_steps(tiny_q4_0, monkeypatch):
    """A verify window's rows (2-4) through the dp4a q/k/v matvec and experts give each row's one-row bytes (the
    tiles fixed at a one-row step's), so speculation's windows stay exact under the switch."""
    from strata.models import dp4a_step

    monkeypatch.setattr(layers, "FUSED_ON_CPU", True)
    model = Engine(tiny_q4_0, EngineConfig(device="cpu", dtype="bfloat16")).model
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(3, model.config.n_embd, generator=gen).to(torch.bfloat16)
    ids = torch.tensor([[0, 5], [7, 2], [5, 0]], dtype=torch.int32)
    weights = torch.rand(3, 2, generator=gen)
    with switches.override(STRATA_DP4A=True):
        stack = dp4a_step.resident_stack(model, 1)
        assert stack is not None and dp4a_step.reads_qkv(model, 1)
        window = dp4a_step.matvec(x, model.attention[1].qkv, "qkv"), dp4a_step.routed_experts(stack, x, weights, ids)
        for r in range(3):
            one = (dp4a_step.matvec(x[r:r + 1], model.attention[1].qkv, "qkv"),
                   dp4a_step.routed_experts(stack, x[r:r + 1], weights[r:r + 1], ids[r:r + 1]))
            assert all(torch.equal(w[r:r + 1], o) for w, o in zip(window, one))
    with switches.override(STRATA_DP4A=False):
        assert dp4a_step.matvec(x, model.attention[1].qkv, "qkv") is None and dp4a_step.resident_stack(model, 1) is None


def test_split_rows_serve_the_dense_matvec_under_their_switch(monkeypatch):
    """STRATA_DP4A_SPLIT: the q/k/v-style matvec reads a split copy of the rows (made once, kept on the weight),
    within the dp4a bound of float64, each row of a window as its one-row step; unset, the GGUF rows as before."""
    import numpy as np

    from strata.kernels.quant import q4_0_split
    from strata.models import dp4a_step
    from strata.models.weights import QuantWeight
    from strata.quant import dequantize
    from strata.quant.random_blocks import random_blocks

    monkeypatch.setattr(layers, "FUSED_ON_CPU", True)
    n_out, n_in = 12, 512
    raw = torch.from_numpy(random_blocks("Q4_0", n_out * n_in // 32, np.random.default_rng(2))).reshape(n_out, -1)
    weight = QuantWeight("blk.0.attn_qkv.weight", dp4a_step.Q4_0, (n_out, n_in), raw)
    x = torch.randn(3, n_in, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    w64 = dequantize(raw, dp4a_step.Q4_0, (n_out, n_in)).double()
    used = []
    real = q4_0_split.split_dp4a_matvec
    monkeypatch.setattr(q4_0_split, "split_dp4a_matvec", lambda *a, **k: used.append(1) or real(*a, **k))
    with switches.override(STRATA_DP4A=True, STRATA_DP4A_SPLIT=False):
        gguf = dp4a_step.matvec(x, weight, "qkv")
    assert not used and dp4a_step.split_rows_of(weight) is None
    with switches.override(STRATA_DP4A=True, STRATA_DP4A_SPLIT=True):
        window = dp4a_step.matvec(x, weight, "qkv")
        rows = [dp4a_step.matvec(x[r:r + 1], weight, "qkv") for r in range(3)]
        kept = dp4a_step.split_rows_of(weight)
    assert len(used) == 4 and torch.equal(kept, q4_0_split.split_rows(raw))
    with switches.override(STRATA_DP4A=True, STRATA_DP4A_SPLIT=True):
        assert dp4a_step.split_rows_of(weight) is kept  # made once, kept on the weight
    assert all(torch.equal(window[r:r + 1], rows[r]) for r in range(3))
    bound = dp4a_gemv.row_error_bound(w64, x.float(), dp4a_gemv.quantize_x(x), terms=n_in // 32)
    want = x.double() @ w64.T
    step = 2.0**-8 * want.abs()  # (the bf16 output's rounding)
    for got in (window, gguf):
        assert ((got.double() - want).abs() <= bound + step).all()
