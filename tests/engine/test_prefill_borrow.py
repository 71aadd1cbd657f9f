"""Streamed prompt chunks whose expert work buffers live in borrowed cache slots (`--prefill-borrow`), on the CPU
through the GPU's code path: the prompt kernels' torch references run in the engine (as the kernels do on a GPU),
the buffers are views into a run of lent slots, the logits bytes are those of all-resident and of not borrowing,
and the cache holds what it held before once the prompt is done. Also the chunk rule's bounds, and the first layer
of each chunk fetched ahead."""

import pytest
import torch

import strata
from strata.engine import experts as experts_module
from strata.engine import prefill_stream
from strata.engine.prefill import (BORROW_MODES, activation_bytes_per_token, chunk_plan, chunk_size,
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
    taken = []
    empty = WorkArena.empty
    monkeypatch.setattr(WorkArena, "empty", lambda self, shape, dtype: taken.append(empty(self, shape, dtype))
                        or taken[-1])
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

    arena = streamer.arena
    run = sorted(set(cache.lent) - set(streamer.ring.indices))
    assert len(run) == n_work and run == list(range(run[0], run[0] + n_work))  # adjacent slots
    first, last = cache.slots[run[0]].data_ptr(), cache.slots[run[-1]].data_ptr() + cache.slot_bytes
    assert taken and arena.overflow_bytes == 0
    assert 0 < arena.high_water <= expert_work_bytes(llm.config, 4) <= n_work * cache.slot_bytes
    for tensor in taken:  # every work buffer of every chunk: a view into the borrowed run
        assert first <= tensor.data_ptr() and tensor.data_ptr() + tensor.numel() * tensor.element_size() <= last

    streamer.return_slots()
    assert cache.owner == before and not cache.lent and streamer.arena is None
    for slot, (layer, e) in ((s, k) for s, k in enumerate(cache.owner) if k is not None):
        stack = cache.stacks[layer]
        host = torch.cat([stack.gate.raw[e].reshape(-1), stack.up.raw[e].reshape(-1), stack.down.raw[e].reshape(-1)])
        assert torch.equal(cache.slots[slot, : host.numel()], host), (slot, layer, e)


def test_first_layer_of_each_chunk_is_fetched_ahead(deep_moe):
    llm = _llm(deep_moe, expert_cache=SLOTS, prefill_stream="on")
    streamer = llm.engine.model.experts.prompt
    first = min(streamer.host_stacks)
    seen = []  # per first-layer run: (experts the last chunk routed there and the cache lacks, held in the ring)
    run = streamer.run

    def traced(layer, x, weights, ids):
        if layer == first:
            wanted = {e for e in streamer.last_routed.get(first, []) if (first, e) not in streamer.cache.slot_of}
            ring = streamer.ring
            seen.append((wanted, {e for (lay, e) in ring.where if lay == first} if ring else set()))
        return run(layer, x, weights, ids)

    streamer.run = traced
    ids = llm.tokenize(TEXT)[:16]  # four chunks
    llm.logits(ids)
    copies = streamer.queue.bytes
    n_chunks = len(seen)
    assert n_chunks == -(-len(ids) // 4) and seen[0][0] == set()  # the first prompt: no routing seen before
    assert all(wanted <= held for wanted, held in seen[1:]) and any(wanted for wanted, _ in seen[1:])
    assert streamer.next_chunk_tokens == 0 and streamer.queue.bytes == copies  # the last chunk fetches nothing after
    llm.logits(ids)  # a second prompt: its first chunk fetches by the first prompt's last chunk's routing
    wanted, held = seen[n_chunks]
    assert wanted and wanted <= held


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
    assert chunk_plan("auto:64", config, False, None, 0, slot, 10_000, "auto").tokens == 64
    assert chunk_plan(300, config, True, 10**6, 0, slot, 10_000, "auto").tokens == 300


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
