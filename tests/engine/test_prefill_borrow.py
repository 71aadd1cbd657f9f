"""Streamed prompt chunks whose expert work buffers live in borrowed cache slots (`--prefill-borrow`), on the CPU
through the GPU's code path: the prompt kernels' torch references run in the engine (as the kernels do on a GPU),
the buffers are views into a run of lent slots, the logits bytes are those of all-resident and of not borrowing,
and the cache holds what it held before once the prompt is done. Also the chunk rule's bounds, and the first layer
of each chunk fetched ahead."""

import pytest
import torch

import strata
from strata import switches
from strata.engine import experts as experts_module
from strata.engine import prefill_stream
from strata.engine.prefill import (BORROW_MODES, ChunkPlan, activation_bytes_per_token, chunk_plan, chunk_size,
                                   expert_work_bytes)
from strata.errors import StrataError
from strata.gguf import GGUFModelFile
from strata.kernels.work_arena import WorkArena
from strata.models import config_of
from strata.models.synthetic import make_model

TEXT = "borrowed slots hold the work buffers of every chunk of this prompt, and then their experts again"
CHUNK = "auto:4"  # chunks of 3-4 tokens: all streamed (>= 2), and work buffers that fit the lendable slots
SLOTS = 120  # of 16 layers x 8 experts: a ring of 16, (120 - 16) / 2 lendable for work buffers


@pytest.fixture(scope="module")
def deep_moe(model_dir):
    """The tiny qwen3moe with 16 layers: enough slots (128 experts) to lend a run for work buffers."""
    return make_model(model_dir / "tiny16-qwen3moe-q8_0.gguf", arch="qwen3moe", preset="tiny", quant="Q8_0",
                      n_layers=16)


@pytest.fixture
def prompt_kernels(monkeypatch):
    """Every chunk takes the prompt experts path (its torch references on the CPU), as chunks do on a GPU."""
    monkeypatch.setattr(experts_module, "kernel_path", lambda stack, x: "prompt")
    monkeypatch.setattr(prefill_stream, "kernel_path", lambda stack, x: "prompt")


def _llm(path, **options):
    return strata.LLM(path, device="cpu", prefill_chunk=CHUNK, kv_dtype="float32", **options)


def test_borrowed_work_buffers_are_slot_views_and_change_no_byte(deep_moe, prompt_kernels, monkeypatch):
    taken = []  # (arena, buffer, the lent run's first slot and size) of every work buffer handed out
    empty = WorkArena.empty

    def recording_empty(self, shape, dtype):
        taken.append((self, empty(self, shape, dtype), sorted(set(cache.lent) - set(streamer.ring.indices))))
        return taken[-1][1]

    monkeypatch.setattr(WorkArena, "empty", recording_empty)
    resident = _llm(deep_moe)
    ids = resident.tokenize(TEXT)[:12]  # three chunks
    expected = resident.logits(ids)
    plain = _llm(deep_moe, expert_cache=SLOTS, prefill_stream="on", prefill_borrow="off")
    assert plain.engine.chunk_plan.work_slots == 0
    assert plain.logits(ids).numpy().tobytes() == expected.numpy().tobytes()
    assert not taken

    llm = _llm(deep_moe, expert_cache=SLOTS, prefill_stream="on", prefill_borrow="on")
    backend = llm.engine.model.experts
    cache, streamer = backend.cache, backend.prompt
    cache.adapt_every = 10**9  # no adapting: the cache must come back exactly as it was
    before = list(cache.owner)
    n_work = llm.engine.chunk_plan.work_slots
    assert 0 < n_work <= streamer.lendable_work_slots()
    got = llm.logits(ids)
    assert got.numpy().tobytes() == expected.numpy().tobytes()

    assert taken
    for arena, tensor, run in taken:  # every work buffer of every chunk: a view into the run of lent slots
        assert len(run) == n_work and run == list(range(run[0], run[0] + n_work))  # adjacent slots
        first, last = cache.slots[run[0]].data_ptr(), cache.slots[run[-1]].data_ptr() + cache.slot_bytes
        assert first <= tensor.data_ptr() and tensor.data_ptr() + tensor.numel() * tensor.element_size() <= last
        assert arena.overflow_bytes == 0 and 0 < arena.high_water <= expert_work_bytes(llm.config, 4)
    assert expert_work_bytes(llm.config, 4) <= n_work * cache.slot_bytes

    # The prompt is over: the slots are back, holding what they held before (the engine refilled them).
    assert cache.owner == before and not cache.lent and streamer.arena is None and streamer.ring is None
    for slot, (layer, e) in ((s, k) for s, k in enumerate(cache.owner) if k is not None):
        stack = cache.stacks[layer]
        host = torch.cat([stack.gate.raw[e].reshape(-1), stack.up.raw[e].reshape(-1), stack.down.raw[e].reshape(-1)])
        assert torch.equal(cache.slots[slot, : host.numel()], host), (slot, layer, e)


def test_first_layer_of_each_chunk_is_fetched_ahead(deep_moe):
    llm = _llm(deep_moe, expert_cache=SLOTS, prefill_stream="on")
    streamer, cache = llm.engine.model.experts.prompt, llm.engine.model.experts.cache
    first, last = min(streamer.host_stacks), max(streamer.host_stacks)
    cache.adapt_every = 10**9
    for key in [k for k in cache.slot_of if k[0] == first]:  # the cache lacks the first layer: every chunk wants some
        slot = cache.slot_of.pop(key)
        cache.owner[slot], cache.owner_row[slot], cache.owner_expert[slot] = None, -1, -1
    log = []

    def fetched_ahead() -> bool:
        """Every first-layer expert the last chunk routed to and the cache lacks is in the ring already."""
        wanted = {e for e in streamer.last_routed.get(first, []) if (first, e) not in streamer.cache.slot_of}
        held = {e for (layer, e) in streamer.ring.where if layer == first} if streamer.ring else set()
        return wanted <= held and bool(wanted)

    def traced(name, fn, layer_of):
        def call(*args):
            log.append((name, layer_of(args), fetched_ahead()))
            return fn(*args)
        return call

    streamer.begin_chunk = traced("begin", streamer.begin_chunk, lambda args: None)
    streamer.run = traced("run", streamer.run, lambda args: args[0])
    streamer._prefetch = traced("prefetch", streamer._prefetch, lambda args: args[0])
    ids = llm.tokenize(TEXT)[:16]  # four chunks
    llm.logits(ids)
    begins = [i for i, entry in enumerate(log) if entry[0] == "begin"]
    assert len(begins) == 4
    for i in begins[1:]:  # chunks 1..3 begin with their first layer fetched during the last chunk's last layer
        assert log[i - 2][:2] == ("run", last) and log[i - 1][:2] == ("prefetch", first) and log[i][2], log[i - 2: i + 1]
    assert log[-1][:2] == ("run", last)  # the last chunk fetches nothing after its last layer
    log.clear()
    llm.logits(ids)  # a second prompt: its first chunk fetches by the first prompt's last routing, when it begins
    assert log[0][0] == "begin" and log[1][:2] == ("prefetch", first) and log[2][:2] == ("run", first) and log[2][2]


def test_chunk_rule_stays_within_the_budget(tiny_moe):
    config = config_of(GGUFModelFile(tiny_moe))
    slot = 6528
    alone_per_token = activation_bytes_per_token(config)
    other_per_token = activation_bytes_per_token(config, routed_in_slots=True)
    assert other_per_token < alone_per_token
    for free in (alone_per_token * 2 * 3, 10**6, 10**7, 10**9):
        for lendable in (0, 10, 100, 10_000):
            plan = chunk_plan("auto", config, True, free, 0, slot, lendable, "auto")
            off = chunk_plan("auto", config, True, free, 0, slot, lendable, "off")
            assert off.work_slots == 0 and off.tokens == chunk_size("auto", config, True, free)
            assert plan.free_tokens == off.tokens and plan.tokens >= off.tokens
            if plan.work_slots:  # borrowing: other scratch in half the free memory, expert buffers in the slots
                assert plan.tokens > off.tokens and plan.tokens * other_per_token <= free // 2
                assert expert_work_bytes(config, plan.tokens) <= plan.work_slots * slot
                assert plan.work_slots <= lendable
            else:
                assert plan.tokens == off.tokens and plan.tokens * alone_per_token <= free // 2
    # A larger chunk than memory alone gives, where the cache can lend enough
    assert chunk_plan("auto", config, True, 10**6, 0, slot, 10_000).work_slots > 0
    # Resident (nothing to lend), the CPU, an explicit size: today's sizes, nothing borrowed
    assert chunk_plan("auto", config, True, 10**6, 0, 0, 0) == chunk_plan("auto", config, True, 10**6, 0, slot, 0)
    assert chunk_plan("auto:64", config, False, None, 0, slot, 10_000, "auto") == ChunkPlan(64, 0, 64)
    assert chunk_plan(300, config, True, 10**6, 0, slot, 10_000, "auto") == ChunkPlan(300, 0, 300)
    on = chunk_plan(300, config, True, 10**6, 0, slot, 10_000, "on")  # "on": borrow for the chunk as it is
    assert on.tokens == 300 and on.work_slots == -(-expert_work_bytes(config, 300) // slot)


def test_too_small_a_budget_or_a_bad_mode_is_one_clear_line(tiny_moe):
    config = config_of(GGUFModelFile(tiny_moe))
    with pytest.raises(StrataError, match="raise --vram-budget, or lower --ctx or --expert-cache"):
        chunk_plan("auto", config, True, 1000, mask_context=4096)
    with pytest.raises(StrataError, match="raise --vram-budget"):
        chunk_plan("auto", config, True, 1000, 4096, 6528, 5, "auto")
    with pytest.raises(StrataError, match="lower --prefill"):
        chunk_plan(512, config, True, None, 0, 6528, 2, "on")
    with pytest.raises(StrataError, match="--prefill-borrow must be one of"):
        chunk_plan("auto", config, True, 10**9, borrow="always")
    assert BORROW_MODES == ("auto", "on", "off")


def test_borrow_run_lends_the_least_routed_adjacent_slots(tiny_moe):
    from strata.engine.expert_cache import ExpertCache
    from strata.models import load_model

    model = load_model(GGUFModelFile(tiny_moe), torch.device("cpu"), torch.float32)
    cache = ExpertCache(model.expert_stacks, 12, torch.device("cpu"))
    cache.fill(cache.even_ranking())
    for layer in cache.counts:
        cache.counts[layer][:] = 50.0
    cheap = [cache.owner[s] for s in (6, 7, 8)]
    for layer, e in cheap:
        cache.counts[layer][e] = 1.0
    before = list(cache.owner)
    assert cache.borrow_run(3) == [6, 7, 8] and all(cache.owner[s] is None for s in (6, 7, 8))
    assert set(cache.lent) == {6, 7, 8} and not {k for k in cheap} & set(cache.slot_of)
    cache.in_use.add(before[2])  # an expert in use is never lent: left are 0-1, 3-5 and 9-11
    with pytest.raises(StrataError, match="cannot lend 4 adjacent slots"):
        cache.borrow_run(4)
    assert cache.borrow_run(3) == [3, 4, 5] and cache.borrow_run(2) == [0, 1] and cache.borrow_run(2) == [9, 10]
    cache.in_use.clear()
    cache.refill()
    assert cache.owner == before and not cache.lent


def test_info_plan_states_the_chunk_and_its_borrowed_slots(tiny_moe):
    from strata.engine.placement import PlacementPlan
    from strata.engine.prefill import describe_chunks

    config = config_of(GGUFModelFile(tiny_moe))
    each = 6528
    room = 4 * 10**6  # what the budget leaves after dense weights, KV and 400 expert slots

    def plan(n_slots, n_experts=1000):
        budget = 10**6 + 2 * 10**6 + n_slots * each + room
        return PlacementPlan("cuda", budget, 10**6, 2 * 10**6, 0, n_experts * each, each, n_experts, n_slots,
                             n_experts * each)

    line = describe_chunks(plan(400), config, 0)
    chunk = chunk_plan("auto", config, True, room, 0, each, (400 - 16) // 2)
    assert chunk.work_slots > 0
    assert f"prompt chunks up to {chunk.tokens} tokens" in line and f"in {chunk.work_slots} borrowed cache slots" in line
    assert "borrowed" not in describe_chunks(plan(1000, 1000), config, 0)  # all resident: nothing to lend
    assert "no slots borrowed (--prefill-borrow off)" in describe_chunks(plan(400), config, 0, borrow="off")


def test_early_copies_are_queued_before_the_routing_read_and_give_the_same_bytes(deep_moe):
    ids = _llm(deep_moe).tokenize(TEXT)[:16]
    resident = _llm(deep_moe).logits(ids)
    for early in (False, True):
        with switches.override(STRATA_PF_EARLY=early):
            llm = _llm(deep_moe, expert_cache=SLOTS, prefill_stream="on")
        streamer = llm.engine.model.experts.prompt
        assert streamer.early == early  # this cache lends a ring of two layers
        log = []
        routed, prefetch = streamer._routed, streamer._prefetch
        streamer._routed = lambda *a: (log.append("read"), routed(*a))[1]
        streamer._prefetch = lambda layer, *a: (log.append(("prefetch", layer)), prefetch(layer, *a))[1]
        got = llm.logits(ids)
        assert got.numpy().tobytes() == resident.numpy().tobytes(), early
        assert streamer.stats.bytes_streamed > 0
        first_read = log.index("read")
        # Early: layer 1's copy is queued before layer 0's routing is read; otherwise after it.
        assert (log.index(("prefetch", streamer.next_layer[min(streamer.host_stacks)])) < first_read) == early
