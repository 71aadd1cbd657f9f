"""Verify windows through the static decode step (engine/spec_windows.py) in its CPU form: the eager window's logits
and hidden states byte for byte, greedy output equal to plain greedy decoding's, the caches after a rejected draft
equal plain decoding's, the union of missed experts looked up once per window, and decode_graphs governing them."""

import pytest
import torch

import strata
from strata.engine.decode import GraphDecoder
from strata.engine.engine import Engine, EngineConfig
from strata.engine.hybrid_cache import HybridCache
from strata.engine.spec import Draft
from strata.errors import StrataError
from tests.engine.cache_compare import assert_close, assert_same_hybrid_state

GREEDY = dict(temperature=0)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def next_mtp(model_dir):
    """A synthetic qwen3next with an MTP block (make-model --mtp)."""
    from strata.models.synthetic import make_model

    return make_model(model_dir / "windows-qwen3next-mtp.gguf", arch="qwen3next", preset="tiny", quant="Q8_0",
                      nextn_layers=1)


@pytest.fixture
def model(request, tiny_moe, next_mtp):
    return {"qwen3moe": tiny_moe, "qwen3next": next_mtp}[request.param]


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _oracle(spec, truth: list[int], wrong_at: set[int]) -> None:
    """Drafts that follow `truth` except a wrong token at the positions in `wrong_at`."""

    def propose(history, k, sampler):
        return [Draft(truth[p] if p not in wrong_at else (truth[p] + 1) % 512, None, "suffix")
                for p in range(len(history), min(len(history) + k, len(truth)))]

    spec.propose = propose


@pytest.mark.parametrize("model", ["qwen3moe", "qwen3next"], indirect=True)
def test_a_window_through_the_static_step_is_the_eager_window_byte_for_byte(model):
    """Windows of 4, 2, 3 and 1 rows, each keeping some rows: logits, hidden states and (hybrid) the recurrent
    states after keep_rows are the eager window's, bit for bit."""
    eager = Engine(model, EngineConfig(device="cpu", spec=4, decode_graphs="off"))
    static = Engine(model, EngineConfig(device="cpu", spec=4, decode_graphs="eager"))
    assert eager.spec.windows is None and static.spec.windows is not None
    prompt = _tokens(9, seed=1)
    eager.prefill(prompt)
    static.prefill(prompt)
    start = len(prompt)
    for window, keep in (([5, 6, 7, 8], 2), ([40, 41], 2), ([300, 301, 302], 1), ([77], 1)):
        want = eager.spec.verify(window, start)
        got = static.spec.verify(window, start)
        assert got.numpy().tobytes() == want.numpy().tobytes()
        if eager.spec.has_mtp:
            rows = slice(start, start + len(window))
            assert static.spec.hidden[rows].numpy().tobytes() == eager.spec.hidden[rows].numpy().tobytes()
        eager.spec.keep(start, keep)
        static.spec.keep(start, keep)
        if isinstance(eager.kv, HybridCache):
            for layer in eager.kv.conv:
                assert torch.equal(static.kv.conv[layer], eager.kv.conv[layer])
                assert torch.equal(static.kv.state[layer], eager.kv.state[layer])
        start += keep
    assert static.spec.windows.steps == {1: 1, 2: 1, 3: 1, 4: 1}
    assert static.cached_tokens == eager.cached_tokens


@pytest.mark.parametrize("window", [2, 3, 4])
@pytest.mark.parametrize("model", ["qwen3moe", "qwen3next"], indirect=True)
def test_greedy_through_windows_equals_plain_greedy(model, window):
    """Drafts right for a while, then wrong at known places: windows keep 1..T rows, output unchanged."""
    prompt = _tokens(10, seed=2)
    plain = strata.LLM(model, device="cpu").generate(prompt, max_tokens=20, **GREEDY).token_ids
    llm = strata.LLM(model, device="cpu", spec=window, decode_graphs="eager")
    _oracle(llm.engine.spec, prompt + plain, wrong_at={len(prompt) + i for i in (2, 5, 6, 11, 15)})
    assert llm.generate(prompt, max_tokens=20, **GREEDY).token_ids == plain
    stats, steps = llm.engine.spec.stats, llm.engine.spec.windows.steps
    assert 0 < sum(stats.accepted) < sum(stats.checked)
    assert sum(steps.values()) == stats.windows and steps[window] > 0


def test_mtp_drafts_through_windows_equal_plain_greedy(next_mtp):
    prompt = _tokens(10, seed=3)
    plain = strata.LLM(next_mtp, device="cpu").generate(prompt, max_tokens=16, **GREEDY).token_ids
    llm = strata.LLM(next_mtp, device="cpu", spec=3, suffix_draft=1, decode_graphs="eager")
    assert llm.generate(prompt, max_tokens=16, **GREEDY).token_ids == plain
    assert llm.engine.spec.stats.checked_by["mtp"] > 0


def test_state_after_a_rejected_draft_equals_plain_decoding(next_mtp):
    """A window of 4 through the static step keeping 2 rows: conv and recurrent states and attention keys equal
    plain decoding's of the same 2 tokens (float32 rounding of a 4-row step against 1-row ones: within 1e-5 of
    the tensor's largest value)."""
    prompt = _tokens(7, seed=4)
    spec = Engine(next_mtp, EngineConfig(device="cpu", kv_dtype="float32", spec=4, decode_graphs="eager"))
    plain = Engine(next_mtp, EngineConfig(device="cpu", kv_dtype="float32"))
    tokens = [5, 17, 99, 300]
    spec.prefill(prompt)
    spec.spec.verify(tokens, len(prompt))
    spec.spec.keep(len(prompt), 2)
    for n in range(3):
        plain.prefill(prompt + tokens[:n])
    a, b = spec.kv, plain.kv
    assert a.length == b.length == len(prompt) + 2 and spec.cached_tokens == plain.cached_tokens
    assert_same_hybrid_state(a, b)
    assert_close(spec.prefill(prompt + tokens[:3]), plain.prefill(prompt + tokens[:3]))


def test_the_graphs_span_gives_the_same_greedy_tokens(next_mtp):
    """What the captured windows run: attention over a power-of-two span, the cells past each row masked; logits
    within float32 rounding of the exact span's (relative 1e-5), the same greedy tokens."""
    prompt = _tokens(10, seed=5)
    plain = strata.LLM(next_mtp, device="cpu", n_ctx=512).generate(prompt, max_tokens=14, **GREEDY).token_ids
    llm = strata.LLM(next_mtp, device="cpu", n_ctx=512, spec=4, decode_graphs="eager")
    engine = llm.engine
    windows = engine.spec.windows
    windows.decoders = {rows: GraphDecoder(engine.model, engine.kv, engine.device, capture=False, rows=rows,
                                           exact_span=False, want_hidden=True, keep_row_states=True)
                        for rows in windows.decoders}
    _oracle(engine.spec, prompt + plain, wrong_at={len(prompt) + 3, len(prompt) + 8})
    assert llm.generate(prompt, max_tokens=14, **GREEDY).token_ids == plain
    exact = Engine(next_mtp, EngineConfig(device="cpu", n_ctx=512, spec=4, decode_graphs="eager"))
    for e in (engine, exact):
        e.prefill(prompt)
    want, got = exact.spec.verify([1, 2, 3, 4], len(prompt)), engine.spec.verify([1, 2, 3, 4], len(prompt))
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def test_offloaded_experts_take_one_lookup_of_the_union_per_window(tiny_moe, tiny_llm):
    """Experts behind a cache of 4 slots, windows through the static step's segments: the same greedy tokens;
    each window looks each layer up once with the union of its rows' experts (plan_step), and the cache's adaptive
    tier steps once per window."""
    prompt = _tokens(8, seed=6)
    plain = tiny_llm.generate(prompt, max_tokens=10, **GREEDY).token_ids
    llm = strata.LLM(tiny_moe, device="cpu", expert_cache=4, spec=4, decode_graphs="eager")
    _oracle(llm.engine.spec, prompt + plain, wrong_at={len(prompt) + 3})
    cache = llm.engine.model.experts.cache
    lookups, original = [], cache.lookup

    def recording(layer, experts):
        lookups.append((layer, list(experts)))
        return original(layer, experts)

    cache.lookup = recording
    assert llm.generate(prompt, max_tokens=10, **GREEDY).token_ids == plain
    windows, n_layers = llm.engine.spec.stats.windows, llm.config.n_layers
    assert sum(llm.engine.spec.windows.steps.values()) == windows
    assert cache.steps == 1 + windows
    assert len(lookups) == n_layers * (1 + windows)
    assert all(len(set(experts)) == len(experts) for _, experts in lookups)
    assert max(len(e) for _, e in lookups[n_layers:]) > llm.config.n_experts_used


def test_decode_graphs_governs_windows(tiny_moe, wide_moe_int8):
    assert Engine(tiny_moe, EngineConfig(device="cpu", spec=3)).spec.windows is None  # auto on the CPU: eager
    assert Engine(tiny_moe, EngineConfig(device="cpu", spec=3, decode_graphs="off")).spec.windows is None
    assert Engine(tiny_moe, EngineConfig(device="cpu", spec=3, decode_graphs="eager")).spec.windows is not None
    # a cache without a static view (quest selection over the dense cache): eager windows, said in one line
    quest = Engine(wide_moe_int8, EngineConfig(device="cpu", spec=3, decode_graphs="eager", kv_dtype="float16",
                                               qsa="quest"))
    assert quest.spec.windows is None
    # over the int8 cache quest selects inside the static step: captured-form windows
    quest = Engine(wide_moe_int8, EngineConfig(device="cpu", spec=3, decode_graphs="eager", kv_dtype="int8",
                                               qsa="quest"))
    assert quest.spec.windows is not None


@pytest.fixture(scope="module")
def wide_moe_int8(model_dir):
    from strata.models.synthetic import make_model

    return make_model(model_dir / "windows-qwen3moe-hd64.gguf", arch="qwen3moe", preset="tiny", quant="Q8_0",
                      head_dim=64, n_embd=128)


def test_spec_auto_stays_off_unless_speculation_can_pay(tiny_moe, next_mtp):
    """The rule: a window only with an MTP head, captured windows and every expert resident; and `auto` on the CPU
    (no graphs) is plain decoding."""
    from strata.engine.spec_auto import AUTO_WINDOW, auto_spec

    assert auto_spec(True, True, True, best=3) == 3
    for has_mtp, captured, resident in ((False, True, True), (True, False, True), (True, True, False)):
        assert auto_spec(has_mtp, captured, resident, best=3) == 1
    assert auto_spec(True, True, True) == AUTO_WINDOW
    for model in (tiny_moe, next_mtp):
        assert Engine(model, EngineConfig(device="cpu", spec="auto", decode_graphs="eager")).spec is None
    with pytest.raises(StrataError, match="spec must be"):
        Engine(tiny_moe, EngineConfig(device="cpu", spec="three"))


def test_plain_decode_steps_keep_the_hidden_states_mtp_drafts_read(next_mtp):
    """A request decoded step by step (logprobs) on a speculating engine: the hidden states at the decoded positions
    are the trunk's (those the prompt path computes for the same tokens), so later drafts start from them."""
    prompt = _tokens(8, seed=7)
    llm = strata.LLM(next_mtp, device="cpu", kv_dtype="float32", spec=3, decode_graphs="eager")
    out = llm.generate(prompt, max_tokens=6, logprobs=2, **GREEDY).token_ids
    ids = prompt + out[:-1]
    kept = llm.engine.spec.hidden[:len(ids)].clone()
    llm.engine.logits(ids)
    assert_close(kept, llm.engine.spec.hidden[:len(ids)])
