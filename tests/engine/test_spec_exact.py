"""Issue 10's greedy exactness by construction: every row of a verify window computes, bit for bit, what plain
decoding's one-token step computes at that position (logits, final hidden states, and the recurrent states kept
after keep_rows), so no near-tie of the logits can split --spec from plain greedy decoding. On the CPU's float32
paths (the eager forward, decode_graphs off, and the static step's CPU form, eager) and, through Triton's
interpreter, the GPU's bf16 kernels (FUSED_ON_CPU: the split-K decode attention, the conv step, the fused norms)."""

import os

import pytest
import torch

from strata.engine.engine import Engine, EngineConfig
from strata.engine.hybrid_cache import HybridCache
from strata.models import layers

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# The bf16 kernels' tests run the GPU's Triton kernels on CPU tensors: only interpreted (on a GPU machine Triton
# compiles for the GPU, where the CUDA tests and tools/device/spec_exact_check.py check the windows).
interpreted_kernels = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                         reason="CPU tensors take Triton only interpreted")
WINDOWS = ((4, 2), (3, 3), (2, 1), (4, 4))  # (rows, rows kept): rejections and full acceptances


@pytest.fixture(scope="module")
def next_mtp(model_dir):
    from strata.models.synthetic import make_model

    return make_model(model_dir / "exact-qwen3next-mtp.gguf", arch="qwen3next", preset="tiny", quant="Q8_0",
                      nextn_layers=1)


@pytest.fixture(scope="module")
def q4(model_dir):
    """qwen4exp with its MTP block; top_k 8, so QSA selects cells past 11 (the windows here reach 22)."""
    from strata.models.synthetic import make_model

    return make_model(model_dir / "exact-qwen4exp-mtp.gguf", arch="qwen4exp", preset="tiny", quant="F32", mtp=True,
                      top_k=8)


@pytest.fixture
def model(request, tiny_moe, next_mtp, q4):
    return {"qwen3moe": tiny_moe, "qwen3next": next_mtp, "qwen4exp": q4}[request.param]


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _states(engine) -> dict:
    kv = engine.kv
    if not isinstance(kv, HybridCache):
        return {}
    return {layer: (kv.conv[layer].clone(), kv.state[layer].clone()) for layer in kv.conv}


def _one_row_steps(path, options, prompt, text):
    """Plain decoding's logits at every position of `text` after the prompt, and a --spec engine's windows of one
    row over the same text: (logits, hidden states, recurrent states after each position)."""
    plain = Engine(path, EngineConfig(device="cpu", **options))
    plain.prefill(prompt)
    ones = Engine(path, EngineConfig(device="cpu", spec=4, **options))
    ones.prefill(prompt)
    logits, hidden, states = [], [], []
    for i, token in enumerate(text):
        want = plain.decode(token, len(prompt) + i).clone()
        got = ones.spec.verify([token], len(prompt) + i).clone()
        assert torch.equal(got, want)  # a window of one row is plain decoding's step
        ones.spec.keep(len(prompt) + i, 1)
        logits.append(got[0])
        hidden.append(None if ones.spec.hidden is None else ones.spec.hidden[len(prompt) + i].clone())
        states.append(_states(ones))
    return logits, hidden, states


def _check_windows(path, options, prompt_len: int = 9, windows=WINDOWS):
    prompt = _tokens(prompt_len, seed=1)
    text = _tokens(sum(rows for rows, _ in windows) + 1, seed=2)
    logits, hidden, states = _one_row_steps(path, options, prompt, text)
    spec = Engine(path, EngineConfig(device="cpu", spec=4, **options))
    spec.prefill(prompt)
    at = 0  # text position of the window's first row
    for rows, keep in windows:
        got = spec.spec.verify(text[at:at + rows], len(prompt) + at)
        for r in range(rows):
            assert torch.equal(got[r], logits[at + r]), f"window of {rows} at {at}: row {r}'s logits"
            if hidden[at + r] is not None:
                assert torch.equal(spec.spec.hidden[len(prompt) + at + r], hidden[at + r]), f"row {r}'s hidden"
        spec.spec.keep(len(prompt) + at, keep)
        for layer, (conv, state) in _states(spec).items():
            want_conv, want_state = states[at + keep - 1][layer]
            assert torch.equal(conv, want_conv) and torch.equal(state, want_state), f"layer {layer} after keep"
        at += keep


@pytest.mark.parametrize("graphs", ["off", "eager"])
@pytest.mark.parametrize("model", ["qwen3moe", "qwen3next", "qwen4exp"], indirect=True)
def test_window_rows_are_plain_decode_steps_bit_for_bit_float32(model, graphs):
    """float32 with the default fp16 KV cache: a window row reads the earlier rows' keys as the cache stores them.
    (qwen4exp: its windows and plain steps through its static step's CPU form when eager, its eager forward off.)"""
    _check_windows(model, dict(decode_graphs=graphs))


@interpreted_kernels
def test_window_rows_are_plain_decode_steps_bit_for_bit_bf16_kernels(next_mtp):
    """bf16 through the GPU's fused kernels (interpreted): the split-K attention takes each row's own split, the
    GatedDeltaNet conv step runs the window's rows as its steps, and row counts never change a reduction."""
    layers.FUSED_ON_CPU = True
    try:
        _check_windows(next_mtp, dict(decode_graphs="eager", dtype="bfloat16"), prompt_len=4, windows=((3, 2),))
    finally:
        layers.FUSED_ON_CPU = False


@interpreted_kernels
def test_qwen4exp_window_rows_are_its_static_steps_bit_for_bit_bf16_kernels(q4):
    """qwen4exp's windows and plain steps through its static step (engine/decode_qwen4exp.py): bf16 through the
    GPU's kernels (interpreted), the QSA layers take each row as its step (the indexer key, the selection by the
    step's own span, the decode attention). Rows at positions 10..12 cross from dense attention (a span of 11
    cells, top_k 8 + 3) to the indexer's selection inside the window: both kinds, each row's picked by position."""
    layers.FUSED_ON_CPU = True
    try:
        _check_windows(q4, dict(decode_graphs="eager", dtype="bfloat16"), prompt_len=10, windows=((3, 2),))
    finally:
        layers.FUSED_ON_CPU = False


@pytest.fixture(scope="module")
def moe_f32(model_dir):
    from strata.models.synthetic import make_model

    return make_model(model_dir / "exact-qwen3moe-f32.gguf", arch="qwen3moe", preset="tiny", quant="F32")


def _near_ties(engine) -> None:
    """Every head row becomes row 0 plus ~10 ulps of noise: all 512 logits lie within rounding of each other, so
    greedy decoding picks by the last bits of the logits (a tie at every step)."""
    c = engine.model.config
    rows = engine.model.output.raw.view(torch.float32).view(c.vocab_size, c.n_embd)
    noise = torch.randn(rows.shape, generator=torch.Generator().manual_seed(5)) * rows[0].abs().mean() * 2**-20
    rows.copy_(rows[0] + noise)


@pytest.mark.parametrize("window", [2, 3, 4])
def test_greedy_spec_equals_plain_where_every_step_is_a_near_tie(moe_f32, window):
    """Drafts that follow plain greedy's tokens but for two wrong ones (windows of every size, rejections): the
    output is plain's token for token, though any rounding difference in a row would flip its argmax."""
    from strata.engine.sampling import SamplingParams
    from strata.engine.spec import Draft

    prompt, n = _tokens(6, seed=3), 14
    plain = Engine(moe_f32, EngineConfig(device="cpu", decode_graphs="eager"))
    _near_ties(plain)
    truth = list(plain.generate(prompt, SamplingParams(temperature=0), n))
    spec = Engine(moe_f32, EngineConfig(device="cpu", decode_graphs="eager", spec=window))
    _near_ties(spec)
    wrong = {len(prompt) + 3, len(prompt) + 8}

    def propose(history, k, sampler):
        at = range(len(history), min(len(history) + k, len(prompt) + n))
        return [Draft(truth[p - len(prompt)] if p not in wrong else (truth[p - len(prompt)] + 1) % 512, None,
                      "suffix") for p in at]

    spec.spec.propose = propose
    assert list(spec.generate(prompt, SamplingParams(temperature=0), n)) == truth
    assert spec.spec.stats.windows < n  # windows of several rows ran
