"""Decode one step ahead (engine/decode_ahead.py, STRATA_DECODE_AHEAD): the plain loop's tokens, greedy and sampled,
each step queued before the host reads the token it takes, the engine's record of the cache still true after a
stop."""

import pytest

from strata import switches
from strata.engine.decode_ahead import runs_ahead
from strata.engine.engine import Engine, EngineConfig
from strata.engine.sampling import SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPT = [5, 17, 99, 3, 250, 7, 31]
GREEDY = SamplingParams(temperature=0)


def _engine(path, **options) -> Engine:
    return Engine(path, EngineConfig(device="cpu", **{"decode_graphs": "eager", **options}))


def _tokens(engine: Engine, mode: int, prompt=PROMPT, max_tokens: int = 8, stop_ids=frozenset()) -> list[int]:
    with switches.override(STRATA_DECODE_AHEAD=mode):
        return list(engine.generate(list(prompt), GREEDY, max_tokens, frozenset(stop_ids)))


@pytest.fixture(scope="module")
def plain(tiny_moe):
    """The plain loop's 8 tokens after PROMPT."""
    return _tokens(_engine(tiny_moe), 0)


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 8])
def test_the_same_tokens_as_the_plain_loop(tiny_moe, plain, max_tokens):
    engine = _engine(tiny_moe)
    assert _tokens(engine, 2, max_tokens=max_tokens) == plain[:max_tokens]
    # no step for the last token: max_tokens leaves no use for it
    assert engine.decoder.steps == max_tokens - 1
    assert engine.cached_tokens == PROMPT + plain[:max_tokens - 1]


def test_each_step_is_queued_before_the_host_reads_its_token(tiny_moe, plain):
    steps = {}
    for mode in (0, 2):
        engine = _engine(tiny_moe)
        with switches.override(STRATA_DECODE_AHEAD=mode):
            tokens = engine.generate(list(PROMPT), GREEDY, 8)
            got = [next(tokens), next(tokens), next(tokens)]
            steps[mode] = engine.decoder.steps
            tokens.close()
        assert got == plain[:3]
    # the third token came from the second step; ahead, the third step (reading it on the device) was already queued
    assert steps == {0: 2, 2: 3}


def test_a_stop_id_ends_it_and_the_cache_record_stays_true(tiny_moe, plain):
    stop = plain[3]
    assert stop not in plain[:3]  # (the tiny model's greedy run: the stop is first met at the fourth token)
    engine = _engine(tiny_moe)
    got = _tokens(engine, 2, stop_ids={stop})
    assert got == plain[:4]
    # the stop's own step ran (queued before the host read it): the record says so, and holds nothing more
    assert engine.decoder.steps == 4 and engine.cached_tokens == PROMPT + plain[:4]
    follow = PROMPT + plain[:4] + [11, 42]
    fresh = _engine(tiny_moe)
    assert _tokens(engine, 2, prompt=follow, max_tokens=4) == _tokens(fresh, 0, prompt=follow, max_tokens=4)


@pytest.mark.parametrize("params", [dict(temperature=0.8, seed=3), dict(temperature=1.0, top_k=0, top_p=0.9, seed=4),
                                    dict(temperature=0.6, top_k=5, min_p=0.1, seed=5)],
                         ids=["default", "top-p", "min-p"])
def test_sampled_tokens_are_the_plain_loops(tiny_moe, params):
    """A seeded draw runs ahead too: its uniforms are taken in the loop's order, the draw made on the device."""
    sampled = SamplingParams(**params)
    tokens = {}
    for mode in (0, 2):
        engine = _engine(tiny_moe)
        with switches.override(STRATA_DECODE_AHEAD=mode):
            tokens[mode] = list(engine.generate(list(PROMPT), sampled, 12))
        assert engine.decoder.steps == 11 + (mode == 0)  # (the plain loop decodes once more, after its last token)
    assert tokens[0] == tokens[2] and len(set(tokens[0])) > 3


def test_the_context_end(tiny_moe, plain):
    n_ctx = len(PROMPT) + 3
    want = _tokens(_engine(tiny_moe, n_ctx=n_ctx), 0)
    engine = _engine(tiny_moe, n_ctx=n_ctx)
    assert _tokens(engine, 2) == want == plain[:3]
    assert engine.decoder.steps == 2


def test_where_it_runs(tiny_moe):
    engine = _engine(tiny_moe)
    with switches.override(STRATA_DECODE_AHEAD=1):  # the default: captured steps only
        assert not runs_ahead(engine, GREEDY)
    with switches.override(STRATA_DECODE_AHEAD=2):
        assert runs_ahead(engine, GREEDY)
        assert runs_ahead(engine, SamplingParams(temperature=0.7, seed=1))
        assert not runs_ahead(engine, SamplingParams(temperature=0, repetition_penalty=1.1))
        assert not runs_ahead(_engine(tiny_moe, decode_graphs="off"), GREEDY)
        assert not runs_ahead(_engine(tiny_moe, expert_cache=3), GREEDY)  # the host inside each step


@pytest.fixture(scope="module")
def tiny_next(model_dir):
    from strata.models.synthetic import make_model

    return make_model(model_dir / "tiny-qwen3next-ahead.gguf", arch="qwen3next", preset="tiny", quant="Q8_0")


def test_a_recurrent_state_after_a_stop(tiny_next):
    """qwen3next (DeltaNet layers: a state that cannot be rewound): the same tokens; after a stop the state holds the
    stop too, as the record says, so the next turn continues from it and a prompt that leaves it starts over, both
    giving what a fresh engine gives."""
    want = _tokens(_engine(tiny_next), 0)
    engine = _engine(tiny_next)
    assert runs_ahead(engine, GREEDY) is False  # (mode 1 on the CPU: not captured)
    assert _tokens(engine, 2) == want and engine.decoder.steps == len(want) - 1  # (ahead: no step after the last)
    first_new = next(i for i in range(1, len(want)) if want[i] not in want[:i])
    stopped = _tokens(engine, 2, stop_ids={want[first_new]})
    assert stopped == want[:first_new + 1] and engine.cached_tokens == PROMPT + stopped
    for follow in (PROMPT + stopped + [11, 42], PROMPT[:3] + [11, 42]):
        assert _tokens(engine, 2, prompt=follow, max_tokens=4) == _tokens(_engine(tiny_next), 0, prompt=follow,
                                                                          max_tokens=4)
