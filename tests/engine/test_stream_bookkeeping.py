"""The prompt streamer's bookkeeping on arrays (issue 6): the ring's batched holds (round robin, never a held slot,
one copy launch a batch, waits only for the reused slots' last readers), the cache's array lookup against the
dict one, and a streamed prompt costing at most two copy launches a layer however many experts it misses."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import strata
from strata import switches
from strata.engine.copy_queue import CopyQueue, Marker
from strata.engine.expert_cache import ExpertCache
from strata.engine.prefill_stream import PromptStreamer
from strata.engine.slot_ring import FORGET_AFTER, NONE, SlotRing
from strata.errors import StrataError
from strata.gguf import GGUFModelFile
from strata.kernels.moe.expert_gather import gather_experts_ref

N_EXPERTS, PART = 16, 8


class RecordingQueue(CopyQueue):
    def __init__(self):
        super().__init__(torch.device("cpu"))
        self.batches = []

    def gather(self, slots, stack, experts, targets, after=()):
        self.batches.append((experts.tolist(), targets.tolist(), list(after)))
        return super().gather(slots, stack, experts, targets, after)


def _stack():
    raw = [torch.arange(N_EXPERTS * PART, dtype=torch.uint8).reshape(N_EXPERTS, 1, PART) + k for k in (0, 100, 200)]
    return SimpleNamespace(gate=SimpleNamespace(raw=raw[0]), up=SimpleNamespace(raw=raw[1]),
                           down=SimpleNamespace(raw=raw[2]), n_experts=N_EXPERTS, expert_bytes=3 * PART)


def _holds_expert(ring, stack, slot, e):
    want = torch.cat([stack.gate.raw[e].reshape(-1), stack.up.raw[e].reshape(-1), stack.down.raw[e].reshape(-1)])
    return torch.equal(ring.slots[slot, : 3 * PART], want)


@pytest.mark.parametrize("form", ["gather", "dma"])  # the batches here are in expert order: the same slots
def test_ring_holds_batches_round_robin_and_never_a_held_slot(form):
    with switches.override(STRATA_PF_STREAM=form):
        queue = RecordingQueue()
    stack = _stack()
    slots = torch.zeros((10, 3 * PART + 1), dtype=torch.uint8)
    first = Marker()
    ring = SlotRing(slots, [9, 2, 5, 7], queue, released=first)
    got, copied = ring.hold_many(0, stack, np.array([3, 11]))
    assert got.tolist() == [9, 2] and copied == 2 and len(queue.batches) == 1
    assert queue.batches[0][2] == [first]  # fresh slots wait for the lending's event only
    assert all(_holds_expert(ring, stack, s, e) for s, e in zip(got.tolist(), [3, 11]))
    got, copied = ring.hold_many(0, stack, np.array([11, 4]))  # 11 is there: held, not copied again
    assert got.tolist() == [2, 5] and copied == 1 and queue.batches[-1][:2] == ([4], [5])
    ring.release(0)
    released = ring._events[int(ring.released[0])]
    got, copied = ring.hold_many(1, stack, np.array([0, 1, 2, 6, 8]))  # 4 free positions, oldest first, from 7
    assert got.tolist() == [7, 9, 2, 5, NONE] and copied == 4
    assert set(map(id, queue.batches[-1][2])) == {id(first), id(released)}  # 7 was never read; 9, 2, 5 were
    assert ring.find((0, 3)) is None and ring.find((0, 11)) is None and ring.find((1, 6)) == 5  # evicted, placed
    assert ring.held == {7: 1, 9: 1, 2: 1, 5: 1} and ring.n_free() == 0
    got, copied = ring.hold_many(2, stack, np.array([5]))  # every slot held: nothing copied
    assert got.tolist() == [NONE] and copied == 0
    ring.wait_landed(1)
    assert (ring.landed == NONE).all()
    ring.release(1)
    assert ring.n_free() == 4 and set(ring.where) == {(1, 0), (1, 1), (1, 2), (1, 6)}
    assert all(_holds_expert(ring, stack, s, e) for (_, e), s in ring.where.items())
    for layer in range(2, 40):  # events no position waits for are dropped
        ring.hold_many(layer, stack, np.array([layer % N_EXPERTS]))
        ring.wait_landed(layer)
        ring.release(layer)
    assert len(ring._events) <= FORGET_AFTER + 1
    assert all(k in ring._events for k in set(ring.released.tolist()) | set(ring.landed.tolist()) - {NONE})


def test_three_copies_form_moves_the_same_bytes():
    stack = _stack()
    by_parts, by_ref = (torch.zeros((6, 3 * PART + 3), dtype=torch.uint8) for _ in range(2))
    experts, targets = np.array([5, 0, 15]), np.array([1, 4, 0])
    CopyQueue._copy_parts(by_parts, stack, experts, targets)
    gather_experts_ref(by_ref, stack, torch.from_numpy(experts), torch.from_numpy(targets))
    assert torch.equal(by_parts, by_ref) and by_ref.any()


def test_array_lookup_is_the_dict_lookup(tiny_moe):
    from strata.models import load_model

    model = load_model(GGUFModelFile(tiny_moe), torch.device("cpu"), torch.float32)
    caches = [ExpertCache(model.expert_stacks, 11, torch.device("cpu")) for _ in range(2)]
    for cache in caches:
        cache.fill(cache.even_ranking())
    for layer in sorted(model.expert_stacks):
        experts = np.array([0, 2, 3, 5, 7])
        hits, misses = caches[0].lookup(layer, experts.tolist())
        slots = caches[1].lookup_slots(layer, experts)
        assert {int(e): int(s) for e, s in zip(experts, slots) if s >= 0} == hits
        assert experts[slots < 0].tolist() == misses
    assert caches[0].stats == caches[1].stats and caches[0].in_use == caches[1].in_use
    assert np.array_equal(caches[0].count_table, caches[1].count_table)


@pytest.mark.parametrize("slots", [8, 12])
def test_a_layer_costs_at_most_two_copy_launches(tiny_moe, slots):
    llm = strata.LLM(tiny_moe, device="cpu", expert_cache=slots, prefill_stream="on", prefill_chunk="auto:16")
    streamer = llm.engine.model.experts.prompt
    ids = llm.tokenize("every layer of every chunk streams its missing experts in one batch or two, never more")
    llm.logits(ids)
    layers = streamer.stats.layers
    assert layers == llm.config.n_layers * streamer.stats.chunks and streamer.stats.bytes_streamed > 0
    assert 0 < streamer.queue.launches <= 2 * layers + 1  # ahead and late, and the first chunk's first layer
    assert streamer.queue.bytes == streamer.stats.bytes_streamed
    assert streamer.stats.refill_bytes > 0 and not streamer.cache.lent  # the lent slots came back, refilled


def _plain_borrow(cache, n):
    """`borrow`'s rule as plain loops: empty slots, then residents not in use, least routed first (then by slot)."""
    residents = sorted((cache.counts[k[0]][k[1]].item(), s) for s, k in enumerate(cache.owner)
                       if k is not None and k not in cache.in_use and s not in cache.lent)
    return (cache.free_slots() + [s for _, s in residents])[:n]


def _plain_run(cache, n):
    """`borrow_run`'s rule as plain loops: the adjacent run with no lent slot or expert in use, least routed, first."""
    runs = []
    for start in range(cache.n_slots - n + 1):
        keys = [(s, cache.owner[s]) for s in range(start, start + n)]
        if any(s in cache.lent or (k is not None and k in cache.in_use) for s, k in keys):
            continue
        runs.append((sum(cache.counts[k[0]][k[1]].item() for _, k in keys if k is not None), start))
    return list(range(min(runs)[1], min(runs)[1] + n)) if runs else None


def test_borrows_choose_as_their_rule_says(tiny_moe):
    from strata.models import load_model

    model = load_model(GGUFModelFile(tiny_moe), torch.device("cpu"), torch.float32)
    rng = np.random.default_rng(0)
    for trial in range(30):
        cache = ExpertCache(model.expert_stacks, int(rng.integers(6, 16)), torch.device("cpu"))
        ranking = cache.even_ranking()
        rng.shuffle(ranking)
        cache.fill([tuple(k) for k in ranking[: int(rng.integers(3, cache.n_slots + 1))]])
        cache.count_table[:] = rng.integers(0, 3, cache.count_table.shape)  # ties: the slot order decides
        keys = list(cache.slot_of)
        cache.in_use = {keys[i] for i in rng.choice(len(keys), min(len(keys), 2), replace=False)}
        if trial % 2:
            cache.borrow(2)
        n = int(rng.integers(1, 4))
        want = _plain_run(cache, n)
        if want is None:
            with pytest.raises(StrataError, match="cannot lend"):
                cache.borrow_run(n)
        else:
            assert cache.borrow_run(n) == want, trial
        m = int(rng.integers(1, 4))
        want = _plain_borrow(cache, m)
        if len(want) < m:
            with pytest.raises(StrataError, match="cannot lend"):
                cache.borrow(m)
        else:
            assert cache.borrow(m) == want, trial


class _Event:
    def __init__(self, done):
        self.done, self.queries = done, 0

    def query(self):
        self.queries += 1
        return self.done


def test_array_lookup_asks_each_copy_event_once(tiny_moe):
    """Slots behind copy events (a GPU's admits, faked here): restored ones are hits behind one compute-stream wait
    per event, others hits once their event has fired, else misses that keep their event."""
    from strata.models import load_model

    model = load_model(GGUFModelFile(tiny_moe), torch.device("cpu"), torch.float32)
    cache = ExpertCache(model.expert_stacks, 16, torch.device("cpu"))
    cache.fill(cache.even_ranking())
    waits = []
    cache._wait_on_compute = waits.append
    refill, swap_done, swap_pending = _Event(False), _Event(True), _Event(False)
    table = cache.layer_slots(0)
    slot_of = {e: int(table[e]) for e in range(8) if table[e] >= 0}
    experts = sorted(slot_of)
    assert len(experts) >= 6
    restored, landed, pending = experts[:3], experts[3:4], experts[4:6]
    for e in restored:
        cache.landing[slot_of[e]] = refill
        cache.restoring.add(slot_of[e])
    for e, event in [(landed[0], swap_done)] + [(e, swap_pending) for e in pending]:
        cache.landing[slot_of[e]] = event
    slots = cache.lookup_slots(0, np.array(experts))
    assert waits == [refill] and swap_done.queries == 1 and swap_pending.queries == 1
    got = dict(zip(experts, slots.tolist()))
    assert all(got[e] == slot_of[e] for e in restored + landed) and all(got[e] == -1 for e in pending)
    assert set(cache.landing) == {slot_of[e] for e in pending} and not cache.restoring


def test_routed_experts_are_the_nonzero_bins():
    ids = torch.randint(0, 48, (200, 4), generator=torch.Generator().manual_seed(3))
    ids[ids == 7] = 8  # one expert no token routes to
    want = np.flatnonzero(torch.bincount(ids.reshape(-1), minlength=64).numpy())
    got = PromptStreamer._routed(SimpleNamespace(idle=None), ids.to(torch.int32), 64)
    assert got.tolist() == want.tolist() and 7 not in got and got.max() < 48
