"""The captured decode's static code, run eagerly on the CPU (its CPU form): the same tokens and logits as the
engine's step-by-step decode, byte for byte with the exact span; within float32 rounding with the graphs' span."""

import pytest
import torch

from strata.engine.decode import GraphDecoder, graphs_wanted
from strata.engine.engine import Engine, EngineConfig
from strata.engine.sampling import SamplingParams
from strata.errors import StrataError

PROMPT = [5, 17, 99, 3, 250, 7, 31]
STEPS = 4


def _logits_run(path, **options):
    """Greedy decode of STEPS tokens after PROMPT: (tokens, the logits of every step as bytes)."""
    engine = Engine(path, EngineConfig(device="cpu", **options))
    logits = engine.prefill(PROMPT)
    tokens, out = [], []
    history = list(PROMPT)
    for _ in range(STEPS):
        token = int(logits[-1].argmax())
        tokens.append(token)
        history.append(token)
        logits = engine.decode(token, len(history) - 1)
        out.append(logits.clone())
    return engine, tokens, out


@pytest.fixture(scope="module")
def wide_moe(model_dir):
    """head_dim 64, as the int8 KV cache needs."""
    from strata.models.synthetic import make_model

    return make_model(model_dir / "graphs-qwen3moe-hd64.gguf", arch="qwen3moe", preset="tiny", quant="Q8_0",
                      head_dim=64, n_embd=128)


@pytest.fixture(scope="module")
def tiny_next(model_dir):
    from strata.models.synthetic import make_model

    return make_model(model_dir / "tiny-qwen3next-graphs.gguf", arch="qwen3next", preset="tiny", quant="Q8_0")


@pytest.mark.parametrize("options", [dict(), dict(kv_dtype="int8"), dict(expert_cache=3)],
                         ids=["fp16-kv", "int8-kv", "cached-experts"])
def test_static_step_is_byte_identical_to_the_eager_step(tiny_moe, wide_moe, options):
    tiny_moe = wide_moe if options.get("kv_dtype") == "int8" else tiny_moe
    eager, want_tokens, want = _logits_run(tiny_moe, **options)
    static, tokens, got = _logits_run(tiny_moe, decode_graphs="eager", **options)
    assert eager.decoder is None and static.decoder is not None and static.decoder.steps == STEPS
    assert tokens == want_tokens
    for a, b in zip(got, want):
        assert a.numpy().tobytes() == b.numpy().tobytes()
    if "expert_cache" in options:  # the layer segments ran: lookups and the pool's work went through plan_step
        assert static.model.experts.cache.stats.misses == eager.model.experts.cache.stats.misses > 0
        assert static.model.experts.pool.stats.experts == eager.model.experts.pool.stats.experts
        assert set(static.decoder.host_seconds) == {"doorbell wait", "plan_step", "launches", "pool wait"}


def test_hybrid_static_step_is_byte_identical(tiny_next):
    _, want_tokens, want = _logits_run(tiny_next)
    _, tokens, got = _logits_run(tiny_next, decode_graphs="eager")
    assert tokens == want_tokens
    assert all(a.numpy().tobytes() == b.numpy().tobytes() for a, b in zip(got, want))


@pytest.mark.parametrize("kv_dtype", ["float16", "int8"])
def test_graph_span_masks_the_cells_past_the_position(tiny_moe, wide_moe, kv_dtype):
    """What the graphs run: attention over a power-of-two span with the cells past the position masked."""
    tiny_moe = wide_moe if kv_dtype == "int8" else tiny_moe
    eager, want_tokens, want = _logits_run(tiny_moe, kv_dtype=kv_dtype, n_ctx=512)
    engine = Engine(tiny_moe, EngineConfig(device="cpu", kv_dtype=kv_dtype, n_ctx=512))
    engine.decoder = GraphDecoder(engine.model, engine.kv, engine.device, capture=False, exact_span=False)
    logits = engine.prefill(PROMPT)
    history, tokens = list(PROMPT), []
    for want_logits in want:
        token = int(logits[-1].argmax())
        tokens.append(token)
        history.append(token)
        logits = engine.decode(token, len(history) - 1)
        scale = want_logits.abs().max()
        assert (logits - want_logits).abs().max() <= 1e-5 * scale  # float32 sums over more (zero) terms
    assert tokens == want_tokens


def test_engine_generate_uses_the_decoder(tiny_moe):
    eager = Engine(tiny_moe, EngineConfig(device="cpu"))
    static = Engine(tiny_moe, EngineConfig(device="cpu", decode_graphs="eager"))
    params = SamplingParams(temperature=0)
    want = list(eager.generate(PROMPT, params, 5))
    assert list(static.generate(PROMPT, params, 5)) == want
    assert static.decoder.steps == 5 and static.cached_tokens == PROMPT + want
    # a second request on the same engine reuses the prefix and rewinds the rest
    assert list(static.generate(PROMPT[:4], params, 3)) == list(eager.generate(PROMPT[:4], params, 3))


def test_modes_and_refusals(tiny_moe):
    cpu = torch.device("cpu")
    assert graphs_wanted("auto", cpu) == "off" and graphs_wanted("eager", cpu) == "eager"
    with pytest.raises(StrataError, match="CUDA"):
        graphs_wanted("on", cpu)
    with pytest.raises(StrataError, match="decode_graphs"):
        graphs_wanted("sometimes", cpu)
    engine = Engine(tiny_moe, EngineConfig(device="cpu", decode_graphs="eager", expert_cache=2, pcie_frac=0.5))
    assert engine.decoder is None  # PCIe-streamed misses: step by step, said in one line


def test_a_window_of_rows_matches_one_token_steps(tiny_moe):
    """rows=T (a verify window): every row's logits as the engine's one-token decode steps give them (issue 10:
    not the prompt path's, which reads the window's own keys at full precision)."""
    eager = Engine(tiny_moe, EngineConfig(device="cpu"))
    static = Engine(tiny_moe, EngineConfig(device="cpu"))
    window = GraphDecoder(static.model, static.kv, static.device, capture=False, rows=2)
    eager.prefill(PROMPT)
    static.prefill(PROMPT)
    start = len(PROMPT)
    for pair in ([11, 12], [40, 41]):
        want = torch.cat([eager.decode(token, start + i) for i, token in enumerate(pair)])
        got = window.step(pair, start)
        assert got.shape == want.shape == (2, eager.model.config.vocab_size)
        assert got.numpy().tobytes() == want.numpy().tobytes()
        start += 2


def test_caches_without_a_static_form_decode_step_by_step(wide_moe):
    """Host-resident pages and Quest over the dense cache have no static view: the engine says so and decodes as
    before (Quest over the int8 cache has one: tests/engine/test_long_decode.py)."""
    for options in (dict(kv_dtype="float16", qsa="quest"), dict(kv_dtype="int8", kv_resident=64)):
        try:
            engine = Engine(wide_moe, EngineConfig(device="cpu", decode_graphs="eager", **options))
        except (StrataError, TypeError) as exc:  # an option this build lacks
            pytest.skip(str(exc))
        assert engine.decoder is None, options
