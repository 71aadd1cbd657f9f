"""Offloaded prompt reading with streamed experts ("device" = CPU: copies at once, events as markers, the GPU's code
path): the same bytes as all-resident, a ring that never overwrites a slot in use, lent slots refilled exactly."""

import pytest
import torch

import strata
from strata import switches
from strata.engine.copy_queue import CopyQueue
from strata.engine.expert_cache import ExpertCache
from strata.engine.prefill_stream import expected_coverage, ring_size
from strata.errors import StrataError
from strata.gguf import GGUFModelFile
from strata.models.synthetic import make_model

TEXT = "streamed experts must give the very same logits as resident ones, chunk after chunk of this prompt"


@pytest.fixture(scope="module")
def deep_moe(model_dir):
    """The tiny qwen3moe with 16 layers: a cache of 120 slots lends a ring of two layers (STRATA_PF_EARLY acts)."""
    return make_model(model_dir / "tiny16s-qwen3moe-q8_0.gguf", arch="qwen3moe", preset="tiny", quant="Q8_0",
                      n_layers=16)


@pytest.fixture(scope="module")
def tiny_next(model_dir):
    return make_model(model_dir / "tiny-qwen3next-q8_0.gguf", arch="qwen3next", preset="tiny", quant="Q8_0")


def _streamed(path, slots, **options):
    return strata.LLM(path, device="cpu", expert_cache=slots, prefill_stream="on", **options)


def _host_bytes(stacks, key):
    layer, e = key
    s = stacks[layer]
    return torch.cat([s.gate.raw[e].reshape(-1), s.up.raw[e].reshape(-1), s.down.raw[e].reshape(-1)])


@pytest.mark.parametrize("arch, form", [("qwen3moe", "gather"), ("qwen3next", "gather"), ("qwen3moe", "dma"),
                                        ("qwen3next", "dma")])
def test_streamed_prompt_gives_the_bytes_of_all_resident(arch, form, tiny_moe, tiny_next):
    path = tiny_moe if arch == "qwen3moe" else tiny_next
    resident = strata.LLM(path, device="cpu", prefill_chunk="auto:16", kv_dtype="float32")
    ids = resident.tokenize(TEXT)
    assert len(ids) > 32  # several chunks, none of a single token
    expected = resident.logits(ids)
    n_experts = resident.config.n_layers * resident.config.n_experts
    for slots in (resident.config.n_experts, n_experts - 1):  # ring = the whole cache; ring + a kept part
        with switches.override(STRATA_PF_STREAM=form):  # dma: the copy engines' plan, run by torch
            llm = _streamed(path, slots, prefill_chunk="auto:16", kv_dtype="float32")
            streamer = llm.engine.model.experts.prompt
            got = llm.logits(ids)
        assert got.numpy().tobytes() == expected.numpy().tobytes(), f"{arch}, {slots} slots, {form}"
        assert streamer.stats.bytes_streamed > 0 and streamer.stats.chunks == -(-len(ids) // 16)
        assert (streamer.copy_calls > 0) == (form == "dma")
        assert streamer.queue.bytes == streamer.stats.bytes_streamed and streamer.late_queue is streamer.queue
    # Chunked and streamed against one unchunked resident pass: the next-token logits within 1e-3 relative.
    whole = strata.LLM(path, device="cpu", prefill_chunk=len(ids), kv_dtype="float32").logits(ids)[-1]
    assert ((got[-1] - whole).abs().max() / whole.abs().max()).item() < 1e-3


@pytest.mark.parametrize("model, form, early", [("tiny", "gather", False), ("tiny", "dma", False),
                                               ("deep", "gather", True), ("deep", "dma", True)])
def test_ring_never_overwrites_a_slot_in_use(tiny_moe, deep_moe, model, form, early):
    """tiny: a ring of all 8 slots = one layer, which must wrap and wait; deep (STRATA_PF_EARLY): a ring of two
    layers, the next layer's copies queued before the routing read and late misses on their own queue."""
    with switches.override(STRATA_PF_STREAM=form, STRATA_PF_EARLY=early):
        _ring_never_overwrites_a_slot_in_use(tiny_moe if model == "tiny" else deep_moe, 8 if model == "tiny" else 120,
                                             early)


def _ring_never_overwrites_a_slot_in_use(path, n_slots, early):
    llm = _streamed(path, n_slots, prefill_chunk="auto:16")
    backend = llm.engine.model.experts
    streamer, cache = backend.prompt, backend.cache
    log = []

    class TracingQueue(CopyQueue):
        def mark(self):
            marker = super().mark()
            log.append(("mark", marker))
            return marker

        def gather(self, slots, stack, experts, targets, after=()):
            log.extend(("copy", int(slot), list(after)) for slot in targets)
            return super().gather(slots, stack, experts, targets, after)

    assert streamer.early == early
    streamer.queue = TracingQueue(torch.device("cpu"))
    if early:  # late misses on their own queue (a second stream on a GPU): traced into the same log
        streamer.late_queue = TracingQueue(torch.device("cpu"))
    compute = streamer._compute

    def traced_compute(layer, stack, x, weights, ids, experts, slots):
        for e, slot in zip(experts.tolist(), slots.tolist()):  # each slot holds its expert's bytes when it computes
            assert torch.equal(cache.slots[slot, : stack.expert_bytes], _host_bytes(cache.stacks, (layer, e)))
            log.append(("use", slot))
        return compute(layer, stack, x, weights, ids, experts, slots)

    streamer._compute = traced_compute
    rings = []
    give_back = streamer.return_slots
    streamer.return_slots = lambda: (rings.append(streamer.ring), give_back())  # the engine's, at the prompt's end
    llm.logits(llm.tokenize(TEXT))
    ring = rings[0]
    assert len(ring) == streamer.ring_slots and not ring.held and streamer.ring is None
    last_use, marked_at, copies = {}, {}, 0
    for i, entry in enumerate(log):
        if entry[0] == "use":
            last_use[entry[1]] = i
        elif entry[0] == "mark":
            marked_at[entry[1].n] = i
        else:
            _, slot, after = entry
            copies += 1
            if slot in last_use:  # the copy waits for an event recorded after the slot's last reader
                assert any(e is not None and marked_at[e.n] > last_use[slot] for e in after), (i, slot)
    assert copies > len(ring)  # the ring wrapped


def test_lent_slots_come_back_with_their_experts(tiny_moe):
    from strata.models import load_model

    model = load_model(GGUFModelFile(tiny_moe), torch.device("cpu"), torch.float32)
    cache = ExpertCache(model.expert_stacks, 10, torch.device("cpu"))
    cache.fill(cache.even_ranking())
    before = (dict(cache.slot_of), list(cache.owner))
    cache.counts[0][:] = torch.arange(8, dtype=torch.float64)  # layer 0's low experts are the least routed
    lent = cache.borrow(4)
    assert len(set(lent)) == 4 and set(cache.lent) == set(lent)
    assert all(cache.owner[s] is None for s in lent) and not set(cache.slot_of.values()) & set(lent)
    hits, misses = cache.lookup(0, [before[1][s][1] for s in lent if before[1][s][0] == 0])
    assert not hits  # lent experts miss
    cache.slots[lent] = 0xAB  # the ring writes there
    cache.counts[1][:] = 100.0
    cache.adapt()  # may fill free slots, never a lent one
    assert all(cache.owner[s] is None for s in lent)
    cache.in_use.clear()
    cache.refill()
    assert not cache.lent
    assert all(cache.slot_of[k] == s for s, k in enumerate(cache.owner) if k is not None)
    assert len(cache.slot_of) == sum(k is not None for k in cache.owner)
    for s in lent:
        assert cache.owner[s] == before[1][s] or before[1][s] in cache.slot_of
    for s, key in enumerate(cache.owner):
        if key is not None:
            assert torch.equal(cache.slots[s, : cache.stacks[key[0]].expert_bytes], _host_bytes(cache.stacks, key))
    with pytest.raises(StrataError, match="cannot lend 11 slots"):
        cache.borrow(11)


def test_refill_is_one_gather_kernel_a_layer_even_where_prompts_stream_by_copy_engines(tiny_moe):
    from strata.models import load_model

    model = load_model(GGUFModelFile(tiny_moe), torch.device("cpu"), torch.float32)
    with switches.override(STRATA_PF_STREAM="dma"):
        cache = ExpertCache(model.expert_stacks, 12, torch.device("cpu"))
        cache.fill(cache.even_ranking())
        before = list(cache.owner)
        lent = cache.borrow(6)
        cache.slots[lent] = 0xCD
        cache.refill()
    queue = cache._queue
    assert queue.form == "dma" and queue.copies == 0  # no copy-engine plan: its scattered runs cost the host
    assert [cache.owner[s] for s in lent] == [before[s] for s in lent]
    assert queue.launches == len({before[s][0] for s in lent}) > 1
    for s in lent:
        assert torch.equal(cache.slots[s, : cache.stacks[cache.owner[s][0]].expert_bytes],
                           _host_bytes(cache.stacks, cache.owner[s]))


def test_engine_returns_lent_slots_before_decoding(tiny_moe):
    llm = _streamed(tiny_moe, 12, prefill_chunk="auto:16")
    cache = llm.engine.model.experts.cache
    tokens = llm.generate(TEXT, max_tokens=3, temperature=0, stop=[]).token_ids
    assert len(tokens) == 3 and not cache.lent and llm.engine.model.experts.prompt.ring is None
    assert all(cache.slot_of[k] == s for s, k in enumerate(cache.owner) if k is not None)
    resident = strata.LLM(tiny_moe, device="cpu", prefill_chunk="auto:16")
    assert tokens == resident.generate(TEXT, max_tokens=3, temperature=0, stop=[]).token_ids


def test_policy_numbers():
    assert expected_coverage(100, 8, 128) > 0.998 and expected_coverage(8, 10, 512) < 0.2
    assert ring_size(4000, 128) == 256 and ring_size(300, 128) == 150 and ring_size(200, 128) == 128
    assert ring_size(100, 128) == 0


def test_small_cache_keeps_the_pool_path_and_bad_mode_is_refused(tiny_moe):
    llm = _streamed(tiny_moe, 3)
    assert not llm.engine.model.experts.prompt.takes(torch.zeros(64, 4))
    with pytest.raises(StrataError, match="--prefill-stream must be one of"):
        strata.LLM(tiny_moe, device="cpu", expert_cache=3, prefill_stream="always")


def test_prefetch_follows_the_last_chunks_routing(tiny_moe):
    llm = _streamed(tiny_moe, 10)  # ring of 8 slots, the cache keeps 2
    streamer = llm.engine.model.experts.prompt
    ring = streamer._ensure_ring()
    cached = {e for layer, e in streamer.cache.slot_of if layer == 1}
    streamer._prefetch(1, n_tokens=2, top_k=2)  # no history, a chunk too small to route to every expert: nothing
    assert not ring.where
    streamer.last_routed[1] = [2, 5, 6]
    streamer._prefetch(1, n_tokens=2, top_k=2)
    assert {e for _, e in ring.where} == {2, 5, 6} - cached and set(ring.held.values()) <= {1}
    ring.release(1)
    del streamer.last_routed[1]
    streamer._prefetch(1, n_tokens=64, top_k=2)  # no history, a large chunk: every expert the cache lacks
    assert {e for layer, e in ring.where if layer == 1} == set(range(8)) - cached


def test_the_copy_engines_ring_is_an_adjacent_run(tiny_moe):
    """Under dma the ring is lent adjacent slots (consecutive positions are consecutive slot rows: long copy runs);
    the default keeps the least-routed slots in the cache's order."""
    import numpy as np

    for form in ("gather", "dma"):
        with switches.override(STRATA_PF_STREAM=form):
            llm = _streamed(tiny_moe, 12)
            streamer = llm.engine.model.experts.prompt
            streamer.cache.count_table[:] = np.random.default_rng(0).random(streamer.cache.count_table.shape)
            ring = streamer._ensure_ring()
        rows = ring.indices
        if form == "dma":
            assert np.array_equal(rows, np.arange(rows[0], rows[0] + len(rows)))
        else:
            assert not np.array_equal(rows, np.sort(rows))  # least routed first: the order the counts give



@pytest.mark.parametrize("form", ["gather", "dma"])
def test_early_late_misses_go_on_their_own_queue(deep_moe, form):
    """STRATA_PF_EARLY: the layer's late misses (after its routing read) on a second queue, never behind the next
    layer's batch; every other copy on the first; the bytes of all-resident."""
    ids = strata.LLM(deep_moe, device="cpu").tokenize(TEXT)[:40]
    resident = strata.LLM(deep_moe, device="cpu", prefill_chunk="auto:16").logits(ids)
    with switches.override(STRATA_PF_STREAM=form, STRATA_PF_EARLY=True):
        llm = _streamed(deep_moe, 120, prefill_chunk="auto:16")
        streamer = llm.engine.model.experts.prompt
        streamer.cache.adapt_every = 10**9
        got = llm.logits(ids)
    assert got.numpy().tobytes() == resident.numpy().tobytes()
    stats, late, ahead = streamer.stats, streamer.late_queue, streamer.queue
    assert streamer.early and late is not ahead and stats.bytes_late > 0
    assert late.bytes == stats.bytes_late and ahead.bytes == stats.bytes_streamed - stats.bytes_late
