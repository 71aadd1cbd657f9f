"""qwen4exp's static decode step (engine/decode_qwen4exp.py) in its CPU form: the same greedy tokens and logits as
the engine's step-by-step decode, byte for byte with the exact span (resident experts and behind an expert cache),
the same cache afterwards, the graphs' span within float32 rounding, and step by step past the dense range."""

import dataclasses

import pytest
import torch

from strata.engine.decode_qwen4exp import Qwen4ExpDecoder
from strata.engine.engine import Engine, EngineConfig
from strata.engine.sampling import SamplingParams
from strata.errors import StrataError
from strata.models.synthetic import make_model

PROMPT = [5, 17, 99, 3, 250, 7, 31]
STEPS = 6  # positions 7..12: one pooled block completes on the way (cells 8..11)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("qwen4exp-graphs") / "tiny.gguf", arch="qwen4exp", preset="tiny",
                      quant="F32")


@pytest.fixture(scope="module")
def tiny_hd64(tmp_path_factory):
    """head_dim 64, as the int8 KV cache needs."""
    return make_model(tmp_path_factory.mktemp("qwen4exp-graphs") / "tiny-hd64.gguf", arch="qwen4exp", preset="tiny",
                      quant="F32", head_dim=64)


def _engine(path, top_k: int | None = None, **options) -> Engine:
    engine = Engine(path, EngineConfig(device="cpu", **options))
    if top_k is not None:  # a small indexer budget: the selection starts after top_k + 3 cells, not 2,051
        engine.model.qsa = dataclasses.replace(engine.model.qsa, top_k=top_k)
    return engine


def _greedy(engine: Engine, steps: int = STEPS) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy decode after PROMPT: (tokens, each step's logits)."""
    logits = engine.prefill(PROMPT)
    history, tokens, out = list(PROMPT), [], []
    for _ in range(steps):
        token = int(logits[-1].argmax())
        tokens.append(token)
        history.append(token)
        logits = engine.decode(token, len(history) - 1)
        out.append(logits.clone())
    return tokens, out


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.numpy().tobytes() == b.numpy().tobytes()


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Within float32 rounding of attention over a longer (masked) span."""
    return a.shape == b.shape and bool((a - b).abs().max() <= 1e-5 * b.abs().max())


def _assert_same_cache(want, got, same, steps: int = STEPS) -> None:
    """The cache after STEPS decode steps holds what the eager steps left: states, the n-gram window and
    history, the indexer's raw and pooled keys (`same`: the comparison of tensors)."""
    assert want.length == got.length and want.previous_tokens == got.previous_tokens
    assert same(got.ple_history, want.ple_history)
    for layer in want.conv:
        assert same(got.conv[layer], want.conv[layer]) and same(got.state[layer], want.state[layer])
    n = len(PROMPT) + steps
    for layer, keys in want.indexer.items():
        mine = got.indexer[layer]
        assert (mine.n_cells, mine.n_pooled) == (keys.n_cells, keys.n_pooled) == (n, n // 4)
        assert same(mine.raw[:n], keys.raw[:n]) and same(mine.keys(), keys.keys())


@pytest.mark.parametrize("options", [dict(), dict(expert_cache=3), dict(expert_cache=3, misses="direct"),
                                     dict(kv_dtype="int8")],
                         ids=["resident", "expert-cache", "direct-misses", "int8-kv"])
def test_static_step_is_byte_identical_to_the_eager_step(tiny, tiny_hd64, options):
    tiny = tiny_hd64 if "kv_dtype" in options else tiny
    eager, static = _engine(tiny, **options), _engine(tiny, decode_graphs="eager", **options)
    want_tokens, want = _greedy(eager)
    tokens, got = _greedy(static)
    assert eager.decoder is None and isinstance(static.decoder, Qwen4ExpDecoder)
    assert static.decoder.steps == STEPS and static.decoder.forward_steps == 0
    assert tokens == want_tokens
    assert all(_same_bytes(a, b) for a, b in zip(got, want))
    _assert_same_cache(eager.kv, static.kv, _same_bytes)
    if "misses" in options:  # one segment: the misses read from host RAM by the step itself, none on the pool
        assert static.decoder.cached is None and static.model.experts.pool.stats.experts == 0
    elif "expert_cache" in options:  # the layer segments ran: lookups and the pool's work went through plan_step
        assert static.model.experts.cache.stats.misses == eager.model.experts.cache.stats.misses > 0
        assert static.model.experts.pool.stats.experts == eager.model.experts.pool.stats.experts


def test_graph_span_masks_the_cells_past_the_position(tiny):
    """What the graphs run: attention over a power-of-two span with the cells past the position masked."""
    want_tokens, want = _greedy(_engine(tiny, n_ctx=512))
    engine = _engine(tiny, n_ctx=512)
    engine.decoder = Qwen4ExpDecoder(engine.model, engine.kv, engine.device, capture=False, exact_span=False)
    tokens, got = _greedy(engine)
    assert tokens == want_tokens
    for a, b in zip(got, want):
        assert (a - b).abs().max() <= 1e-5 * b.abs().max()  # float32 sums over more (zero) terms


@pytest.mark.parametrize("options", [dict(), dict(expert_cache=3), dict(top_k=8)],
                         ids=["resident", "expert-cache", "selecting"])
def test_one_program_per_span_serves_every_step(tiny, options):
    """As a graph replays: the span's program is built once and rerun each step, so nothing of a step (position,
    token, n-gram rows, block) may be fixed when it is built. With an indexer budget of 8 the span of 256 selects
    every step (all cells until the 12th)."""
    steps = 12 if "top_k" in options else STEPS
    eager = _engine(tiny, n_ctx=512, **options)
    want_tokens, want = _greedy(eager, steps)
    engine = _engine(tiny, n_ctx=512, **options)
    decoder = Qwen4ExpDecoder(engine.model, engine.kv, engine.device, capture=False, exact_span=False)
    built = {}
    build = decoder._program
    decoder._program = lambda span: built[span] if span in built else built.setdefault(span, build(span))
    engine.decoder = decoder
    tokens, got = _greedy(engine, steps)
    assert list(built) == [256] and decoder.steps == steps
    assert tokens == want_tokens
    assert all(_close(a, b) for a, b in zip(got, want))
    _assert_same_cache(eager.kv, engine.kv, _close, steps)


@pytest.mark.parametrize("kv_dtype", ["float16", "int8"])
def test_past_the_dense_range_the_step_selects_cells(tiny, tiny_hd64, kv_dtype):
    """With an indexer budget of 8 the selection starts past 11 cells: the static step scores the pooled keys it
    wrote, selects (at most 11 of up to 19 cells) and attends over the selection, as the eager step does."""
    tiny = tiny_hd64 if kv_dtype == "int8" else tiny
    eager = _engine(tiny, top_k=8, kv_dtype=kv_dtype)
    want_tokens, want = _greedy(eager, steps=12)
    static = _engine(tiny, top_k=8, kv_dtype=kv_dtype, decode_graphs="eager")
    tokens, got = _greedy(static, steps=12)
    assert static.decoder.steps == 12 and static.decoder.forward_steps == 0
    assert tokens == want_tokens
    assert all(_same_bytes(a, b) for a, b in zip(got, want))
    _assert_same_cache(eager.kv, static.kv, _same_bytes, steps=12)


def test_engine_generate_uses_the_decoder(tiny):
    eager, static = _engine(tiny), _engine(tiny, decode_graphs="eager")
    params = SamplingParams(temperature=0)
    want = list(eager.generate(PROMPT, params, 5))
    assert list(static.generate(PROMPT, params, 5)) == want
    assert static.decoder.steps == 5 and static.cached_tokens == PROMPT + want
    # a second request: the hybrid cache starts over (or from a checkpoint) and the window follows
    assert list(static.generate(PROMPT[:4], params, 3)) == list(eager.generate(PROMPT[:4], params, 3))


def test_refusals(tiny):
    engine = _engine(tiny)
    with pytest.raises(StrataError, match="runs 1..4 tokens"):
        Qwen4ExpDecoder(engine.model, engine.kv, engine.device, capture=False, rows=5)
    with pytest.raises(StrataError, match="no static qwen4exp step"):
        Qwen4ExpDecoder(engine.model, engine.kv.kv, engine.device, capture=False)
    decoder = Qwen4ExpDecoder(engine.model, engine.kv, engine.device, capture=False)
    engine.prefill(PROMPT)
    window = engine.kv.previous_tokens
    with pytest.raises(StrataError, match="cannot continue at position 3"):
        decoder.step([11], 3)
    assert engine.kv.previous_tokens == window  # refused before the n-gram window moved
    assert not Engine(tiny, EngineConfig(device="cpu", decode_graphs="off")).decoder
