"""`--misses direct` adapts without making decode wait (issue 4): the device's routing counts come back window by
window through a non-blocking copy and an event the host only queries. On the CPU the same code runs (the copies
are done when queued): the schedule, exact hit counts against the table each window ran with, the cache's
invariants, and decode's tokens and bytes."""

import torch

from strata.engine.direct_misses import DeviceTable, Readout
from strata.engine.engine import Engine, EngineConfig
from strata.engine.sampling import SamplingParams

PROMPT = [5, 17, 99, 3, 250, 7, 31]


def _engine(path, adapt_every=4, **options):
    engine = Engine(path, EngineConfig(device="cpu", expert_cache=options.pop("expert_cache", 4), misses="direct",
                                       **options))
    engine.model.experts.cache.adapt_every = adapt_every
    return engine


def _generate(engine, steps=8, each=None):
    tokens = []
    for token in engine.generate(PROMPT, SamplingParams(temperature=0), steps):
        tokens.append(token)
        if each is not None:
            each()
    logits = engine.decode(tokens[-1], len(PROMPT) + len(tokens) - 1)
    return tokens, logits.numpy().tobytes()


def _state(engine):
    cache = engine.model.experts.cache
    counts = b"".join(c.numpy().tobytes() for c in cache.counts.values())
    return counts, list(cache.owner), cache.stats.swaps, cache.stats.bytes_moved, cache.device_table.host.clone()


def test_windows_end_every_period_and_the_next_step_adapts(tiny_moe, monkeypatch):
    """adapt_every 4: a window ends at steps 4k (the period) and 4k+1 (before the swaps change the table); the swaps
    come at 4k+1, from counts up to step 4k."""
    engine = _engine(tiny_moe)
    cache, table = engine.model.experts.cache, engine.model.experts.cache.device_table
    closes, adapts = [], []
    close, adapt = DeviceTable._close, cache.adapt
    monkeypatch.setattr(DeviceTable, "_close", lambda self, adapt: (closes.append((cache.steps, adapt)),
                                                                    close(self, adapt)))
    monkeypatch.setattr(cache, "adapt", lambda: (adapts.append(cache.steps), adapt())[1])
    _generate(engine, steps=9)
    n = cache.steps  # the prompt, then one a token
    assert closes == [(s, s % 4 == 0) for s in range(1, n + 1) if s % 4 in (0, 1) and s > 1]
    assert adapts == [s for s in range(5, n + 1, 4)]
    assert cache.stats.adapts == len(adapts) and table.window == n - closes[-1][0]


def test_a_readout_not_landed_waits_for_a_later_step_never_for_the_device(tiny_moe, monkeypatch):
    """The GPU running behind: an event not yet complete leaves its window for a later step; nothing synchronizes."""
    engine = _engine(tiny_moe, adapt_every=2)
    cache = engine.model.experts.cache
    queried = {}

    def ready(self):  # each readout lands only at its third query
        queried[id(self)] = queried.get(id(self), 0) + 1
        return queried[id(self)] >= 3

    def no_wait(self):
        raise AssertionError("decode waited for the device")

    monkeypatch.setattr(Readout, "ready", ready)
    monkeypatch.setattr(Readout, "wait", no_wait)
    monkeypatch.setattr(DeviceTable, "read_stats", no_wait)
    tokens, _ = _generate(engine)
    assert cache.stats.adapts > 0 and cache.stats.swaps > 0
    assert len(tokens) == 8


def test_each_window_runs_with_one_table_and_the_hits_are_exact(tiny_moe, monkeypatch):
    """Every routed pair is a hit or a miss of the table its step ran with; a slot the table names holds that
    expert's bytes whenever a step reads it (a swap never overwrites an expert in use); no slot holds two."""
    engine = _engine(tiny_moe, adapt_every=2, expert_cache=6)
    cache = engine.model.experts.cache
    table = cache.device_table
    windows, seen, count = [0], [], DeviceTable.count
    close = DeviceTable._close

    def closing(self, adapt):
        windows[0] += 1
        close(self, adapt)

    def counting(self, layer, ids):
        row = self.host[self.row[layer]].clone()
        seen.append((windows[0], layer, row, ids.reshape(-1).tolist()))
        stack = cache.stacks[layer]
        for e in set(ids.reshape(-1).tolist()):
            slot = int(row[e])
            if slot >= 0:
                want = torch.cat([p.raw[e].reshape(-1) for p in (stack.gate, stack.up, stack.down)])
                assert torch.equal(cache.slots[slot, : want.numel()], want), (layer, e, slot)
        count(self, layer, ids)

    monkeypatch.setattr(DeviceTable, "_close", closing)
    monkeypatch.setattr(DeviceTable, "count", counting)
    _generate(engine, steps=10)
    table.read_stats()
    tables = {}
    for window, layer, row, _ in seen:
        assert torch.equal(tables.setdefault((window, layer), row), row), "the table changed inside a window"
    hits = sum(int(row[e]) >= 0 for _, _, row, ids in seen for e in ids)
    assert (cache.stats.hits, cache.stats.misses) == (hits, sum(len(ids) for *_, ids in seen) - hits)
    assert cache.stats.swaps > 0 and 0 < hits
    keys = [k for k in cache.owner if k is not None]
    assert len(keys) == len(set(keys)) == len(cache.slot_of)
    assert all(cache.owner[slot] == key for key, slot in cache.slot_of.items())


def test_same_tokens_as_resident_and_the_same_bytes_twice_whoever_reads_the_counters(tiny_moe):
    """Greedy tokens and logits bytes of resident experts; two runs give the same bytes, decayed counts, slots and
    swaps, also when a reader asks for the hit counters after every token (they wait; the schedule does not move)."""
    resident = _generate(Engine(tiny_moe, EngineConfig(device="cpu")))
    engine = _engine(tiny_moe, adapt_every=1)  # the most windows and swaps
    first = _generate(engine)
    again = _engine(tiny_moe, adapt_every=1)
    second = _generate(again, each=again.model.experts.cache.device_table.read_stats)
    assert first == second == resident
    a, b = _state(engine), _state(again)
    assert a[:4] == b[:4] and torch.equal(a[4], b[4]) and a[2] > 0
    for e in (engine, again):
        e.model.experts.cache.device_table.read_stats()
    assert engine.model.experts.cache.stats == again.model.experts.cache.stats


def test_the_static_step_adapts_the_same_way(tiny_moe):
    """The decode graphs' CPU form (one segment a step) gives the same tokens, bytes and cache state as step by step."""
    plain = _engine(tiny_moe, 2)
    static = _engine(tiny_moe, 2, decode_graphs="eager")
    assert _generate(plain) == _generate(static)
    a, b = _state(plain), _state(static)
    assert a[:4] == b[:4] and torch.equal(a[4], b[4])


def test_the_old_schedule_behind_its_switch_waits_and_adapts_at_the_period(tiny_moe, monkeypatch):
    """STRATA_ADAPT_SYNC (before/after runs): one window per period, waited for, the swaps at once; same tokens."""
    from strata import switches

    with switches.override(STRATA_ADAPT_SYNC=True):
        engine = _engine(tiny_moe)
    cache = engine.model.experts.cache
    waits, adapts, adapt = [], [], cache.adapt
    wait = Readout.wait
    monkeypatch.setattr(Readout, "wait", lambda self: (waits.append(cache.steps), wait(self)))
    monkeypatch.setattr(cache, "adapt", lambda: (adapts.append(cache.steps), adapt())[1])
    tokens = _generate(engine, steps=9)
    assert adapts == waits == [4, 8]
    assert tokens == _generate(_engine(tiny_moe), steps=9)


def test_a_table_change_between_periods_ends_the_window_first(tiny_moe, monkeypatch):
    """A prompt's lent slots change the table outside end_step: the steps before still count against the old one."""
    engine = _engine(tiny_moe, adapt_every=10**6, expert_cache=6)  # no period ends: only the lend ends a window
    cache, table = engine.model.experts.cache, engine.model.experts.cache.device_table
    seen, count = [], DeviceTable.count
    monkeypatch.setattr(DeviceTable, "count", lambda self, layer, ids: (
        seen.append((self.host[self.row[layer]].clone(), ids.reshape(-1).tolist())), count(self, layer, ids)))
    tokens, _ = _generate(engine, steps=4)
    before = table.host.clone()
    steps = table.window
    cache.borrow(4)
    assert len(table.pending) == 1 and table.pending[0].steps == steps and table.window == 0
    assert (table.pending[0].table == before.numpy()).all() and not torch.equal(table.host, before)
    position = len(PROMPT) + len(tokens)
    for token in tokens[:3]:
        engine.decode(token, position)
        position += 1
    table.read_stats()
    hits = sum(int(row[e]) >= 0 for row, ids in seen for e in ids)
    assert (cache.stats.hits, cache.stats.misses) == (hits, sum(len(ids) for _, ids in seen) - hits)


def test_an_admit_enters_the_table_at_the_next_period_end_however_slow_its_copy(tiny_moe):
    """Which step first reads an admitted expert from its slot depends on the steps alone: the table never asks
    whether the copy landed (on a GPU the compute stream waits for it instead, a wait free once it has)."""

    class NeverLanded:
        def query(self):
            raise AssertionError("the table asked whether a copy had landed")

    engine = _engine(tiny_moe, adapt_every=4)
    cache, table = engine.model.experts.cache, engine.model.experts.cache.device_table
    cache.adapt = lambda: 0  # only the admit below
    layer, e = next((layer, e) for layer in table.row for e in range(table.shape[1])
                    if (layer, e) not in cache.slot_of)
    cache.admit((layer, e), 0)
    cache.landing[0] = NeverLanded()
    entered = []
    for _ in range(6):
        cache.end_step()
        entered.append(int(table.host[table.row[layer], e]) == 0)
    assert entered == [False, False, False, True, True, True]
    assert int(table.missing[table.row[layer], e]) == -1
