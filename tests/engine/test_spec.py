"""Speculative decoding (engine/spec.py): greedy output equals plain decoding's, the caches after a rejected draft
equal plain decoding's, sampling keeps the distribution, the counters count exactly, and the MTP block computes
the checkpoint's formula (against a float64 re-implementation on transformers' own modules)."""

import copy

import pytest
import torch

import strata
from strata.engine.hybrid_cache import HybridCache
from strata.engine.sampling import Sampler, SamplingParams
from strata.engine.spec import Draft, SpecDecoder, prompt_lookup
from strata.errors import StrataError
from tests.engine.cache_compare import assert_close, assert_same_hybrid_state

GREEDY = dict(temperature=0)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _tokens(n: int, seed: int, vocab: int = 512) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def next_mtp(model_dir):
    """A tiny transformers Qwen3-Next with a random mtp.* block, written as GGUF (blk.4.nextn.*)."""
    from strata.tokenizer_train import train_small_bpe
    from tools.export_hf import export_gguf, make_hf_model

    model = make_hf_model("qwen3next", seed=11, mtp=True)
    path = model_dir / "qwen3next-mtp.gguf"
    export_gguf(model, path, "F32", tokenizer_metadata=train_small_bpe(model.config.vocab_size))
    return model, path


def _oracle(decoder: SpecDecoder, truth: list[int], wrong_at: set[int]):
    """A drafter that proposes the true continuation, except a wrong token at the positions in `wrong_at`."""

    def propose(history, k, sampler):
        drafts = []
        for pos in range(len(history), min(len(history) + k, len(truth))):
            token = truth[pos] if pos not in wrong_at else (truth[pos] + 1) % 512
            drafts.append(Draft(token, None, "suffix"))
        return drafts

    decoder.propose = propose


# ------------------------------------------------------------------------------------------------ greedy


@pytest.mark.parametrize("window", [2, 3, 4])
def test_greedy_with_prompt_lookup_drafts_equals_plain_decoding(tiny_moe, tiny_llm, window):
    """qwen3moe has no MTP block: drafts come from prompt lookup, some accepted, some not."""
    prompt = _tokens(12, seed=1)
    plain = tiny_llm.generate(prompt, max_tokens=48, **GREEDY).token_ids
    llm = strata.LLM(tiny_moe, device="cpu", spec=window)
    assert llm.generate(prompt, max_tokens=48, **GREEDY).token_ids == plain
    stats = llm.engine.spec.stats
    assert 0 < sum(stats.accepted) < sum(stats.checked)  # both outcomes crossed
    assert stats.tokens == len(plain) - 1  # the first token comes from the prompt pass


@pytest.mark.parametrize("window", [2, 4])
def test_greedy_with_mtp_drafts_equals_plain_decoding(next_mtp, window):
    _, path = next_mtp
    prompt = _tokens(10, seed=2)
    plain = strata.LLM(path, device="cpu").generate(prompt, max_tokens=24, **GREEDY).token_ids
    llm = strata.LLM(path, device="cpu", spec=window, suffix_draft=1)
    assert llm.generate(prompt, max_tokens=24, **GREEDY).token_ids == plain
    stats = llm.engine.spec.stats
    assert stats.checked_by["mtp"] > 0 and sum(stats.checked) > sum(stats.accepted)


def test_spec_min_p_ends_mtp_drafts_and_prompt_lookup_takes_over(next_mtp):
    """A floor no draft of a random head reaches: no MTP draft is checked, prompt-lookup drafts are, output unchanged."""
    _, path = next_mtp
    prompt = torch.randperm(512, generator=torch.Generator().manual_seed(12)).tolist()  # every token has a match
    plain = strata.LLM(path, device="cpu", n_ctx=540).generate(prompt, max_tokens=16, **GREEDY).token_ids
    llm = strata.LLM(path, device="cpu", n_ctx=540, spec=3, spec_min_p=0.999, suffix_draft=2)
    assert llm.generate(prompt, max_tokens=16, **GREEDY).token_ids == plain
    stats = llm.engine.spec.stats
    assert stats.checked_by["mtp"] == 0 and stats.checked_by["suffix"] > 0


def test_partial_acceptance_through_gated_deltanet_equals_plain_decoding(next_mtp):
    """Drafts right for a while, then wrong: every window keeps a different number of rows of a hybrid cache."""
    _, path = next_mtp
    prompt = _tokens(9, seed=3)
    plain = strata.LLM(path, device="cpu").generate(prompt, max_tokens=20, **GREEDY).token_ids
    llm = strata.LLM(path, device="cpu", spec=4)
    truth = prompt + plain
    _oracle(llm.engine.spec, truth, wrong_at={len(prompt) + i for i in (2, 6, 7, 12, 15)})
    assert llm.generate(prompt, max_tokens=20, **GREEDY).token_ids == plain
    stats = llm.engine.spec.stats
    assert stats.accepted[0] > 0 and stats.accepted[2] > 0 and sum(stats.checked) > sum(stats.accepted)


def test_counters_are_exact(tiny_moe, tiny_llm):
    """An oracle wrong at known positions: windows, checks and acceptances follow by hand.

    Window 4, 7 tokens after the first: window 1 drafts positions 1,2,3 (2 wrong): accepts 1, rejects 2 -> 2 tokens.
    Window 2 from position 3 drafts 3,4,5: all right -> 4 tokens (3 drafts + 1). Position 7 is the last token:
    window 3 has no room for drafts (max_tokens) -> 1 token."""
    prompt = _tokens(8, seed=4)
    plain = tiny_llm.generate(prompt, max_tokens=8, **GREEDY).token_ids
    llm = strata.LLM(tiny_moe, device="cpu", spec=4)
    _oracle(llm.engine.spec, prompt + plain, wrong_at={len(prompt) + 2})
    assert llm.generate(prompt, max_tokens=8, **GREEDY).token_ids == plain
    s = llm.engine.spec.stats
    assert (s.windows, s.tokens) == (3, 7)
    assert s.proposed == [2, 2, 2] and s.checked == [2, 2, 1] and s.accepted == [2, 1, 1]


def test_stop_inside_a_window_leaves_the_cache_as_plain_decoding_does(tiny_moe, tiny_llm):
    prompt = _tokens(8, seed=5)
    plain = tiny_llm.generate(prompt, max_tokens=12, **GREEDY).token_ids
    stop = plain[4]
    llm = strata.LLM(tiny_moe, device="cpu", spec=4)
    _oracle(llm.engine.spec, prompt + plain, wrong_at=set())
    out = list(llm.engine.generate(prompt, SamplingParams(temperature=0), 12, frozenset({stop})))
    assert out == plain[:plain.index(stop) + 1]
    assert llm.engine.cached_tokens == prompt + out[:-1]


# ------------------------------------------------------------------------------------------------ rollback


def test_state_after_a_rejected_draft_equals_plain_decoding(next_mtp):
    """One window of 4 rows of which 2 are kept: conv and recurrent states and attention keys equal those of plain
    decoding of the same 2 tokens (to the float32 rounding of a 4-row matmul against 1-row ones: the largest
    difference within 1e-5 of the tensor's largest value); the rejected rows leave no trace."""
    _, path = next_mtp
    prompt = _tokens(7, seed=6)
    spec = strata.LLM(path, device="cpu", kv_dtype="float32", spec=4).engine
    plain = strata.LLM(path, device="cpu", kv_dtype="float32").engine
    tokens = [5, 17, 99, 300]
    spec.prefill(prompt)
    spec.spec.verify(tokens, len(prompt))
    spec.spec.keep(len(prompt), 2)
    for n in range(3):  # the prompt, then tokens 0 and 1 one at a time
        plain.prefill(prompt + tokens[:n])
    a, b = spec.kv, plain.kv
    assert isinstance(a, HybridCache) and a.length == b.length == len(prompt) + 2
    assert spec.cached_tokens == plain.cached_tokens
    assert_same_hybrid_state(a, b)
    # and the next step from there reads the same logits
    assert_close(spec.prefill(prompt + tokens[:3]), plain.prefill(prompt + tokens[:3]))


# ------------------------------------------------------------------------------------------------ sampling


def test_speculative_sampling_acceptance_keeps_the_target_distribution():
    """The acceptance rule alone, on a 6-token vocabulary: draft from q, keep from p. 5000 windows of one draft;
    the first token's frequencies match p within 5 standard errors, for an MTP draft (q) and a point-mass one.
    (Drawing the rejected token from p instead of max(0, p - q) would put token 1 at 0.34, 12 errors off.)"""
    p = torch.tensor([0.02, 0.40, 0.05, 0.30, 0.18, 0.05])
    q = torch.tensor([0.50, 0.05, 0.25, 0.05, 0.05, 0.10])
    decoder = SpecDecoder.__new__(SpecDecoder)
    from strata.engine.spec import SpecStats

    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, seed=0)
    rows = torch.log(p)[None].repeat(2, 1)
    n = 5000
    for point_mass in (False, True):
        decoder.stats = SpecStats(2)
        sampler = Sampler(params)
        counts = torch.zeros(6)
        for _ in range(n):
            token = 3 if point_mass else int(torch.multinomial(q, 1, generator=sampler.generator))
            first = decoder.accept(rows, [Draft(token, None if point_mass else q, "mtp")], [], sampler)[0]
            counts[first] += 1
        se = (p * (1 - p) / n).sqrt()
        assert ((counts / n - p).abs() < 5 * se).all(), (counts / n, p)
        expected = p[3] if point_mass else torch.minimum(p, q).sum()
        assert abs(decoder.stats.accepted[0] / n - expected) < 5 * (expected * (1 - expected) / n) ** 0.5


def test_sampled_tokens_keep_the_distribution_on_a_model(next_mtp):
    """The second generated token (the first one a verify window decides) is drawn from the mixture over the first
    token of the model's top-3 distributions: computed exactly by plain forward passes, and matched by 120 seeded
    speculative runs (chi-square with 2 dof below 13.8, p = 0.001)."""
    _, path = next_mtp
    prompt = _tokens(6, seed=7)
    params = dict(temperature=1.0, top_k=3, top_p=1.0)
    plain = strata.LLM(path, device="cpu")
    sampler = Sampler(SamplingParams(**params))
    first = sampler.distribution(plain.logits(prompt)[-1], prompt)
    first = first / first.sum()
    second = torch.zeros_like(first)
    for t in first.nonzero().flatten().tolist():
        p = sampler.distribution(plain.logits(prompt + [t])[-1], prompt + [t])
        second += first[t] * p / p.sum()
    llm = strata.LLM(path, device="cpu", spec=2)
    counts = torch.zeros_like(first)
    n = 120
    for seed in range(n):
        out = list(llm.engine.generate(prompt, SamplingParams(seed=seed, **params), 3))
        counts[out[1]] += 1
    support = second > 0
    assert counts[~support].sum() == 0
    expected = second[support] * n
    chi2 = ((counts[support] - expected) ** 2 / expected).sum().item()
    assert chi2 < {2: 13.8, 3: 16.3, 4: 18.5, 5: 20.5, 6: 22.5, 7: 24.3, 8: 26.1}[int(support.sum()) - 1]
    assert llm.engine.spec.stats.checked[0] == n


# ------------------------------------------------------------------------------------------------ MTP block


def test_mtp_forward_matches_a_float64_reimplementation(next_mtp):
    """Our MTP cells against the checkpoint's formula in float64 on transformers' modules:
    fc([pre_fc_norm_embedding(embed(t_{i+1})), pre_fc_norm_hidden(h_i)]) -> decoder layer -> norm -> lm_head."""
    model, path = next_mtp
    ids = _tokens(12, seed=8)
    hf = copy.deepcopy(model).to(torch.float64)
    hf.config._experts_implementation = "eager"  # the grouped-GEMM path has no float64
    x = torch.tensor([ids])
    with torch.no_grad():
        hidden = hf.model(x).last_hidden_state[0]  # after the final norm
        mtp = hf.mtp
        cells = torch.cat((mtp.pre_fc_norm_embedding(hf.model.embed_tokens(x[0, 1:])),
                           mtp.pre_fc_norm_hidden(hidden[:-1])), dim=-1)
        h = mtp.fc(cells)[None]
        positions = torch.arange(len(ids) - 1)[None]
        out = mtp.layers[0](h, position_embeddings=hf.model.rotary_emb(h, positions), position_ids=positions)
        out = out[0] if isinstance(out, tuple) else out
        ref = hf.lm_head(mtp.norm(out[0]))
    engine = strata.LLM(path, device="cpu", kv_dtype="float32", spec=2).engine
    engine.logits(ids)
    torch.testing.assert_close(engine.spec.hidden[:len(ids)].double(), hidden, rtol=0, atol=1e-4)
    cache = engine.model.new_mtp_cache(64, "float32")
    logits, _ = engine.model.mtp_forward(engine.spec.hidden[:len(ids) - 1], torch.tensor(ids[1:]), cache, 0)
    error = ((logits.double() - ref).abs().max() / ref.abs().max()).item()
    assert error < 1e-4
    # cell by cell through the cache (as drafting runs them) gives the same rows
    cache = engine.model.new_mtp_cache(64, "float32")
    rows = [engine.model.mtp_forward(engine.spec.hidden[i:i + 1], torch.tensor([ids[i + 1]]), cache, i)[0]
            for i in range(len(ids) - 1)]
    torch.testing.assert_close(torch.cat(rows), logits, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------------ small parts


def test_prompt_lookup_continues_the_latest_match():
    assert prompt_lookup([1, 2, 3, 4, 9, 2, 3, 4, 7, 8, 2, 3, 4], 3) == [7, 8, 2]
    assert prompt_lookup([5, 6, 5], 2) == [6, 5]
    assert prompt_lookup([1, 2, 3], 2) == []
    assert prompt_lookup([1, 2, 1], 0) == []


def test_spec_one_is_plain_decoding_and_bad_options_are_one_line(tiny_moe):
    assert strata.LLM(tiny_moe, device="cpu", spec=1).engine.spec is None
    for options in ({"spec": 5}, {"spec": 0}, {"spec_min_p": 1.5}, {"suffix_draft": -1}):
        with pytest.raises(StrataError) as error:
            strata.LLM(tiny_moe, device="cpu", **options)
        assert "\n" not in str(error.value)


# ------------------------------------------------------------------------------------------------ quality harness


def test_teacher_forced_reads_through_verify_windows(tiny_moe, tmp_path):
    """`spec=3` as an engine option of the harness: every position after the prefix is scored once, from verify
    windows, with the logits plain decoding reads there (relative 1e-5)."""
    import json
    from importlib import resources

    from strata import switches
    from strata.eval.logpos import read_records
    from strata.eval.teacher_forced import _engine_options, run_worker

    text = tmp_path / "text.txt"
    text.write_text(resources.files("strata").joinpath("data/tokenizer_corpus.txt").read_text()[:1500])
    records = {}
    for label, options in (("plain", {}), ("spec", {"spec": "3", "spec_min_p": "0.0"})):
        logpos = tmp_path / f"{label}.logpos"
        with switches.override(STRATA_LOGPOS=str(logpos), STRATA_LOGPOS_TOPK=4):
            run_worker(str(tiny_moe), str(text), 20, 11, 6, str(tmp_path / f"{label}.json"),
                       {"device": "cpu", **_engine_options(options)})
        records[label] = read_records(logpos)
        greedy = json.loads((tmp_path / f"{label}.json").read_text())["greedy"]
        records[label + "-greedy"] = greedy
    assert sorted(records["spec"]) == sorted(records["plain"]) == list(range(20, 31))
    for pos, plain in records["plain"].items():
        spec = records["spec"][pos]
        assert spec.top1 == plain.top1 and abs(spec.lp_target - plain.lp_target) <= 1e-5 * abs(plain.lp_target)
    assert records["spec-greedy"] == records["plain-greedy"]


def test_server_metrics_show_the_counters(tiny_moe):
    from prometheus_client import generate_latest

    from strata.serve.metrics import Metrics

    llm = strata.LLM(tiny_moe, device="cpu", spec=3)
    llm.generate(_tokens(10, seed=9), max_tokens=12, **GREEDY)
    stats = llm.engine.spec.stats
    text = generate_latest(Metrics(llm.engine, lambda: 0, lambda: 0).registry).decode()
    assert f"strata_spec_windows {float(stats.windows)}" in text
    assert f"strata_spec_drafts_accepted {float(sum(stats.accepted))}" in text
    assert stats.windows > 0


def test_offloaded_experts_take_one_lookup_of_the_union_per_window(tiny_moe, tiny_llm):
    """Experts behind a cache of 4 slots: same greedy tokens; each window looks each layer up once with the union of
    its rows' experts, and the cache's adaptive tier steps once per window."""
    prompt = _tokens(8, seed=10)
    plain = tiny_llm.generate(prompt, max_tokens=10, **GREEDY).token_ids
    llm = strata.LLM(tiny_moe, device="cpu", expert_cache=4, spec=4)
    _oracle(llm.engine.spec, prompt + plain, wrong_at={len(prompt) + 3})
    cache = llm.engine.model.experts.cache
    lookups, original = [], cache.lookup

    def recording(layer, experts):
        lookups.append((layer, list(experts)))
        return original(layer, experts)

    cache.lookup = recording
    assert llm.generate(prompt, max_tokens=10, **GREEDY).token_ids == plain
    windows = llm.engine.spec.stats.windows
    n_layers = llm.config.n_layers
    assert cache.steps == 1 + windows  # the prompt (one chunk), then one step per verify window
    assert len(lookups) == n_layers * (1 + windows)
    assert all(len(set(experts)) == len(experts) for _, experts in lookups)
    assert max(len(e) for _, e in lookups[n_layers:]) > llm.config.n_experts_used  # several rows' experts at once
