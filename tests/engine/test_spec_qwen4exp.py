"""Speculative decoding on qwen4exp (engine/spec.py with models/qwen4exp.py): greedy output equal to plain greedy
decoding's across rejections, and after a rejected draft every per-sequence state (GatedDeltaNet, attention KV,
indexer keys and their pooled blocks, the n-gram token window and conv history) equal to plain decoding's."""

import pytest
import torch

import strata
from strata.engine.engine import Engine, EngineConfig
from strata.engine.sampling import SamplingParams
from strata.engine.spec import Draft
from strata.errors import StrataError
from tests.engine.cache_compare import assert_close, assert_same_hybrid_state

GREEDY = dict(temperature=0)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def q4(model_dir):
    """The tiny synthetic qwen4exp with its MTP block; top_k 8, so QSA selects cells past 11 (top_k + 3)."""
    from strata.models.synthetic import make_model

    return make_model(model_dir / "spec-qwen4exp-mtp.gguf", arch="qwen4exp", preset="tiny", quant="F32", mtp=True,
                      top_k=8)


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _oracle(spec, truth: list[int], wrong_at: set[int]) -> None:
    def propose(history, k, sampler):
        return [Draft(truth[p] if p not in wrong_at else (truth[p] + 1) % 512, None, "suffix")
                for p in range(len(history), min(len(history) + k, len(truth)))]

    spec.propose = propose


@pytest.mark.parametrize("window", [2, 3, 4])
def test_greedy_with_rejections_equals_plain_greedy(q4, window):
    """Drafts right for a while, then wrong at known places (windows keep 1..T rows, across QSA selection and
    several completed indexer blocks): the same tokens as plain greedy decoding."""
    prompt = _tokens(6, seed=1)
    plain = strata.LLM(q4, device="cpu").generate(prompt, max_tokens=24, **GREEDY).token_ids
    llm = strata.LLM(q4, device="cpu", spec=window)
    _oracle(llm.engine.spec, prompt + plain, wrong_at={len(prompt) + i for i in (2, 5, 6, 11, 14, 19)})
    assert llm.generate(prompt, max_tokens=24, **GREEDY).token_ids == plain
    stats = llm.engine.spec.stats
    assert 0 < sum(stats.accepted) < sum(stats.checked) and stats.windows >= 6


def test_mtp_drafts_equal_plain_greedy(q4):
    prompt = _tokens(8, seed=2)
    plain = strata.LLM(q4, device="cpu").generate(prompt, max_tokens=16, **GREEDY).token_ids
    llm = strata.LLM(q4, device="cpu", spec=3, suffix_draft=1, decode_graphs="eager")
    assert llm.engine.spec.windows is not None  # windows through qwen4exp's static step (its CPU form)
    assert llm.generate(prompt, max_tokens=16, **GREEDY).token_ids == plain
    assert llm.engine.spec.stats.checked_by["mtp"] > 0


@pytest.mark.parametrize("keep", [1, 3])
def test_state_after_a_rejected_draft_equals_plain_decoding(q4, keep):
    """A window at positions 10..13 (cell 11 completes an indexer block, past QSA's 11 dense cells) keeping 1 or 3
    rows, against plain decoding of the same tokens: every state within float32 rounding of a 4-row step against
    1-row ones (1e-5 of the tensor's largest value), the counts and token window exactly."""
    prompt = _tokens(10, seed=3)
    tokens = [5, 17, 99, 300]
    spec = Engine(q4, EngineConfig(device="cpu", kv_dtype="float32", spec=4))
    plain = Engine(q4, EngineConfig(device="cpu", kv_dtype="float32"))
    spec.prefill(prompt)
    spec.spec.verify(tokens, len(prompt))
    spec.spec.keep(len(prompt), keep)
    plain.prefill(prompt)
    for n in range(keep):
        plain.decode(tokens[n], len(prompt) + n)
    a, b = spec.kv, plain.kv
    assert a.length == b.length == len(prompt) + keep and spec.cached_tokens == plain.cached_tokens
    assert_same_hybrid_state(a, b)
    for layer in a.kv_slot:
        ka, kb = a.indexer[layer], b.indexer[layer]
        assert (ka.n_cells, ka.n_pooled) == (kb.n_cells, kb.n_pooled) == (a.length, a.length // 4)
        assert_close(ka.raw[:ka.n_cells], kb.raw[:kb.n_cells])
        assert_close(ka.keys(), kb.keys())
    assert a.previous_tokens == b.previous_tokens
    assert_close(a.ple_history, b.ple_history)
    # and the next step reads the same logits (QSA selects from the restored indexer keys)
    position = len(prompt) + keep
    assert_close(spec.decode(7, position), plain.decode(7, position))


def test_rows_of_a_plain_step_cannot_be_dropped(q4):
    engine = Engine(q4, EngineConfig(device="cpu"))
    engine.prefill(_tokens(6, seed=4))
    engine._forward([1, 2], 6, all_logits=False)  # two tokens, not a verify window
    with pytest.raises(StrataError, match="cannot be dropped"):
        engine.kv.keep_rows(1)


def test_mtp_keys_after_rejected_drafts_are_the_trunks(q4):
    """Drafts after drafts write MTP keys from the block's own output; once rejected, the next window's catch-up
    rewrites those cells from the trunk's hidden states: after a run, the MTP layer's keys and values of every
    current cell equal one pass of the block over the trunk's stacks (float32 rounding: 1e-5 of the largest)."""
    prompt = _tokens(8, seed=5)
    llm = strata.LLM(q4, device="cpu", kv_dtype="float32", spec=4)
    out = list(llm.engine.generate(prompt, SamplingParams(temperature=0), 14))  # no stop token
    spec = llm.engine.spec
    cells, ids = spec.mtp_cells, prompt + out
    assert cells > len(prompt) and sum(spec.stats.checked) > sum(spec.stats.accepted)
    fresh = llm.engine.model.new_cache(64, "float32")
    llm.engine.model.mtp_draft(spec.hidden[:cells], torch.tensor(ids[1:cells + 1]), fresh, 0)
    ours, ref = llm.engine.kv.mtp_kv.read(0, cells, torch.float32), fresh.mtp_kv.read(0, cells, torch.float32)
    for x, y in zip(ours, ref):
        assert_close(x, y)
