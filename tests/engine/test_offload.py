"""Experts in host RAM behind a device cache, misses on the CPU pool: same tokens, honest bookkeeping, real overlap."""

import json
import threading

import pytest
import torch

import strata
from strata.engine.cpu_pool import CPUExpertPool
from strata.engine.expert_cache import ExpertCache
from strata.engine.offload import load_profile
from strata.engine.placement import plan_placement
from strata.errors import StrataError
from strata.gguf import GGUFModelFile
from strata.models import config_of

PROMPT = "Experts may live anywhere; the tokens must not change"


def _greedy(llm):
    return llm.generate(PROMPT, max_tokens=16, temperature=0, stop=[]).token_ids


def test_greedy_tokens_do_not_depend_on_placement(tiny_moe, tiny_llm):
    n_experts = tiny_llm.config.n_layers * tiny_llm.config.n_experts
    expected = _greedy(tiny_llm)
    for slots in (0, max(1, n_experts // 10), n_experts - 1):
        llm = strata.LLM(tiny_moe, device="cpu", expert_cache=slots)
        assert not llm.engine.plan.all_resident
        assert _greedy(llm) == expected, f"expert_cache={slots}"
        assert torch.allclose(llm.logits(tiny_llm.tokenize(PROMPT)), tiny_llm.logits(tiny_llm.tokenize(PROMPT)),
                              rtol=1e-4, atol=1e-5)


def test_same_run_twice_gives_identical_bytes(tiny_moe):
    runs = []
    for _ in range(2):
        llm = strata.LLM(tiny_moe, device="cpu", expert_cache=3)
        runs.append(llm.logits(llm.tokenize(PROMPT)).numpy().tobytes())
    assert runs[0] == runs[1]


def test_cache_bookkeeping(tiny_moe):
    llm = strata.LLM(tiny_moe, device="cpu", expert_cache=4)
    backend = llm.engine.model.experts
    cache = backend.cache
    routed = []
    original = cache.lookup

    def recording_lookup(layer, experts):
        routed.append(len(experts))
        in_use_before = set(cache.in_use)
        owners_before = list(cache.owner)
        hits, misses = original(layer, experts)
        assert set(hits) | set(misses) == set(experts) and not set(hits) & set(misses)
        assert cache.owner == owners_before and in_use_before <= cache.in_use
        return hits, misses

    cache.lookup = recording_lookup
    adapt = cache.adapt

    def checked_adapt():
        in_use = {(k, cache.slot_of[k]) for k in cache.in_use if k in cache.slot_of}
        swaps = adapt()
        for key, slot in in_use:  # an expert in use keeps its slot
            assert cache.owner[slot] == key
        return swaps

    cache.adapt = checked_adapt
    llm.generate(PROMPT, max_tokens=12, temperature=0, stop=[])
    stats = cache.stats
    assert stats.hits + stats.misses == sum(routed) > 0
    assert stats.swaps > 0  # the tier adapted to what was routed
    keys = [k for k in cache.owner if k is not None]
    assert len(keys) == len(set(keys)) == len(cache.slot_of)  # no slot holds two experts, none is held twice
    for key, slot in cache.slot_of.items():
        assert cache.owner[slot] == key
        layer, e = key
        gate, up, down = cache.expert_weights(layer, slot)
        stack = backend.host_stacks[layer]
        assert torch.equal(gate.raw, stack.gate.raw[e]) and torch.equal(down.raw, stack.down.raw[e])


def test_adapt_prefers_hot_missing_experts_and_spares_those_in_use(tiny_llm):
    stacks = tiny_llm.engine.model.expert_stacks
    cache = ExpertCache(stacks, n_slots=2, device="cpu", adapt_every=1000)
    cache.fill([(0, 0), (0, 1)])
    cache.counts[0][5] = 10.0  # hot, missing
    cache.counts[0][6] = 9.0  # hot, missing
    cache.counts[0][0] = 1.0
    cache.counts[0][1] = 0.5
    cache.in_use = {(0, 0)}  # routed this step: must stay
    assert cache.adapt() == 1
    assert cache.slot_of.keys() == {(0, 0), (0, 5)}


class SlowPool(CPUExpertPool):
    """A CPU pool that cannot finish before the device side has done its part."""

    def __init__(self, stacks, events):
        super().__init__(stacks)
        self.events, self.device_done, self.started = events, threading.Event(), threading.Event()

    def compute(self, *args):
        self.events.append("cpu start")
        self.started.set()
        assert self.device_done.wait(timeout=30), "the device side never ran while the CPU worked"
        self.events.append("cpu done")
        return super().compute(*args)


def test_cpu_pool_overlaps_with_device_work(tiny_moe, tiny_llm):
    llm = strata.LLM(tiny_moe, device="cpu", expert_cache=8)
    backend = llm.engine.model.experts
    events = []
    backend.pool = SlowPool(backend.host_stacks, events)
    real = backend.cache.expert_weights

    def device_side(layer, slot):
        if "device hit" not in events:  # the first waits (a while at most) for the submitted CPU task to start
            backend.pool.started.wait(timeout=5)
        events.append("device hit")
        backend.pool.device_done.set()
        return real(layer, slot)

    backend.cache.expert_weights = device_side
    got = llm.logits(llm.tokenize(PROMPT))
    assert torch.allclose(got, tiny_llm.logits(tiny_llm.tokenize(PROMPT)), rtol=1e-4, atol=1e-5)
    first_done = events.index("cpu done")
    assert events.index("cpu start") < events.index("device hit") < first_done


def test_placement_plan_and_its_errors(tiny_moe):
    model = GGUFModelFile(tiny_moe)
    config = config_of(model)
    plan = plan_placement(model, config, torch.device("cpu"), 256, 2)
    assert plan.all_resident and plan.n_slots == plan.n_experts == config.n_layers * config.n_experts
    plan = plan_placement(model, config, torch.device("cpu"), 256, 2, expert_cache=5)
    assert plan.n_slots == 5 and plan.host_expert_bytes == plan.expert_bytes and "5 of 16 experts" in plan.describe()
    with pytest.raises(StrataError, match="VRAM budget is 0.50 GiB \\(raise --vram-budget, lower --ctx"):
        plan_placement(model, config, torch.device("cpu"), 256, 2, vram_budget_gib=0.5)
    for nothing in (0, -3, float("nan")):
        with pytest.raises(StrataError, match="--vram-budget must be a positive number of GiB"):
            plan_placement(model, config, torch.device("cpu"), 256, 2, vram_budget_gib=nothing)
    roomy = plan_placement(model, config, torch.device("cpu"), 256, 2, vram_budget_gib=0.8)
    assert roomy.all_resident
    with pytest.raises(StrataError, match="--expert-cache 100000 needs"):
        plan_placement(model, config, torch.device("cpu"), 256, 2, vram_budget_gib=0.69, expert_cache=100000)


def test_the_plan_counts_the_split_copies_under_their_switches(model_dir, monkeypatch):
    """STRATA_DP4A + STRATA_DP4A_SPLIT keep a second copy of the attention's Q4_0 q/k/v and o rows (made at the first
    decode step): the plan's dense bytes include them, so the expert cache is sized after them; the bytes a token
    reads (the bench's floor) do not: a copy is read in place of its original."""
    from strata import switches
    from strata.kernels.quant import q4_0_split
    from strata.models.synthetic import make_model

    model = GGUFModelFile(make_model(model_dir / "tiny-qwen3moe-q4_0-plan.gguf", arch="qwen3moe", preset="tiny",
                                     quant="Q4_0"))
    config = config_of(model)
    attention = sum(t.n_bytes for name, t in model.tensors.items()
                    if name.split(".")[-2] in ("attn_q", "attn_k", "attn_v", "attn_output"))
    assert attention > 0
    plain = plan_placement(model, config, torch.device("cpu"), 256, 2)
    with switches.override(STRATA_DP4A=True, STRATA_DP4A_SPLIT=True):
        assert plan_placement(model, config, torch.device("cpu"), 256, 2).dense_bytes == plain.dense_bytes  # 64 wide
        monkeypatch.setattr(q4_0_split, "splits", lambda n_in: True)  # as if the tiny rows took the layout
        split = plan_placement(model, config, torch.device("cpu"), 256, 2)
        assert split.dense_bytes == plain.dense_bytes + attention
        assert split.dense_read_bytes == plain.dense_read_bytes == plain.dense_bytes
    with switches.override(STRATA_DP4A=True, STRATA_DP4A_SPLIT=False):
        assert plan_placement(model, config, torch.device("cpu"), 256, 2).dense_bytes == plain.dense_bytes


def test_profile_fills_the_cache_in_its_order(tiny_moe, tmp_path, tiny_llm):
    from strata.engine.profile import profile_routing

    path = tmp_path / "profile.json"
    result = profile_routing(tiny_llm.engine, "a text to count routings on, long enough to route many ways", path)
    k = tiny_llm.config.n_experts_used
    assert sum(sum(row) for row in result["counts"].values()) == result["tokens"] * k * tiny_llm.config.n_layers
    ranking = load_profile(str(path), tiny_llm.engine.model.expert_stacks)
    llm = strata.LLM(tiny_moe, device="cpu", expert_cache=3, expert_profile=str(path))
    assert set(llm.engine.model.experts.cache.slot_of) == set(ranking[:3])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"counts": {"0": [1] * 99}}))
    with pytest.raises(StrataError, match="names expert .* which this model lacks"):
        load_profile(str(bad), tiny_llm.engine.model.expert_stacks)
    # every expert resident (no cache to fill): a profile that does not fit the model is still refused at load
    with pytest.raises(StrataError, match="names expert .* which this model lacks"):
        strata.LLM(tiny_moe, device="cpu", expert_profile=str(bad))
    with pytest.raises(StrataError, match="not a routing profile"):
        strata.LLM(tiny_moe, device="cpu", expert_profile=str(tmp_path / "missing.json"))


def test_hybrid_cache_counts_attention_layers_and_fixed_state(tmp_path):
    from strata.engine.placement import cache_bytes
    from strata.models.synthetic import make_model

    config = config_of(GGUFModelFile(make_model(tmp_path / "q3n.gguf", arch="qwen3next", preset="tiny")))
    assert config.recurrent_layers == (True, False)
    kv = 2 * 1 * 256 * config.n_kv_heads * config.head_dim * 2  # one attention layer, fp16
    conv_channels = 2 * config.ssm_group_count * config.ssm_state_size + config.ssm_inner_size
    state = 4 * (config.ssm_inner_size * config.ssm_state_size + (config.ssm_conv_kernel - 1) * conv_channels)
    assert cache_bytes(config, 256, 2) == kv + state
    assert cache_bytes(config, 512, 2) - cache_bytes(config, 256, 2) == kv  # the state does not grow with context
