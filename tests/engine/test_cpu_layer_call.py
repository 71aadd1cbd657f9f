"""The pool's one-native-call layer path and its spinning worker: the same bytes as the tested `moe_experts` SIMD path
(so its float64 bound holds: test_cpu_kernels checks that path against float64), whatever the routing's form, the
output buffer or the spin; jobs run in order and their errors reach the caller."""

import numpy as np
import pytest
import torch

from strata import switches
from strata.engine.cpu_kernels import HostExperts, moe_experts
from strata.engine.cpu_kernels.layer_call import LayerBuffers
from strata.engine.cpu_pool import CPUExpertPool
from strata.engine.pool_worker import SpinningWorker
from strata.errors import StrataError
from tests.engine.test_cpu_kernels import _stack

STACKS = [("Q4_0",) * 3, ("Q4_K", "Q4_K", "Q6_K"), ("Q2_0",) * 3, ("Q8_0", "Q8_0", "Q4_0")]


def _routing(rng, tokens=4, k=3, n_experts=6):
    ids = torch.stack([torch.randperm(n_experts, generator=torch.Generator().manual_seed(t))[:k] for t in range(tokens)])
    weights = torch.softmax(torch.from_numpy(rng.normal(size=(tokens, k)).astype(np.float32)), dim=-1)
    return ids, weights, {e: (ids == e).nonzero(as_tuple=True) for e in ids.unique().tolist()}


@pytest.mark.parametrize("act", ["i16", "i8"])
@pytest.mark.parametrize("types", STACKS, ids=["/".join(t) for t in STACKS])
def test_layer_call_gives_the_bytes_of_the_tested_path(types, act):
    rng = np.random.default_rng(11)
    stack = _stack(types, rng)
    host = HostExperts(stack.gate, stack.up, stack.down)
    host.simd = act
    buffers = LayerBuffers(host.types, 512, 256, act)
    for tokens in (1, 4, 2):  # the buffers grow, then serve a smaller call: nothing carries over
        x = torch.from_numpy(rng.normal(size=(tokens, 512)).astype(np.float32))
        ids, weights, routes = _routing(rng, tokens)
        routed = [e for e in (5, 1, 0, 3, 2, 4) if e in routes][:3]
        experts = routed + [e for e in range(6) if e not in routes][:1]  # and one no token routes to, if any
        want = moe_experts(host, x, routes, weights, routed).numpy()
        out = np.full((tokens, 512), np.nan, np.float32)
        buffers.run(host.views, x.numpy(), ids.numpy(), weights.numpy(), np.asarray(experts, np.int64), out)
        assert out.tobytes() == want.tobytes(), f"{types} {act} T={tokens}"
    out = np.full((1, 512), np.nan, np.float32)  # no pairs at all: zeros
    buffers.run(host.views, x[:1].numpy(), ids[:1].numpy(), weights[:1].numpy(), np.asarray([99], np.int64), out)
    assert not out.any()


def test_pool_takes_routes_or_ids_and_an_output_buffer_with_the_same_bytes():
    rng = np.random.default_rng(12)
    stack = _stack(("Q4_K", "Q4_K", "Q6_K"), rng)
    x = torch.from_numpy(rng.normal(size=(3, 512)).astype(np.float32))
    ids, weights, routes = _routing(rng, 3)
    experts = sorted(routes)[1:]
    want = moe_experts(HostExperts(stack.gate, stack.up, stack.down), x, routes, weights, experts)
    pool = CPUExpertPool({0: stack}, spin_us=200)
    try:
        by_routes = pool.submit(0, x, routes, weights, experts).result()
        by_ids = pool.submit(0, x, None, weights, experts, ids=ids).result()
        buffer = torch.full((3, 512), float("nan"))
        into = pool.submit(0, x, None, weights, experts, ids=ids, out=buffer).result()
        spun = torch.full((3, 512), float("nan"))
        waited = pool.result(pool.submit(0, x, None, weights, experts, ids=ids, out=spun))  # on the done flag
        assert waited is spun and pool.done[0] == 2  # the second call with an output buffer (numbered 1, 2)
        assert pool.result(pool.submit(0, x, routes, weights, experts)).numpy().tobytes() == want.numpy().tobytes()
        with switches.override(STRATA_CPU_POOL_OLD=True):  # a layer the SIMD path does not take: routes from ids
            old_pool = CPUExpertPool({0: stack}, spin_us=0)
        old = old_pool.submit(0, x, None, weights, experts, ids=ids, out=torch.empty(3, 512)).result()
        old_pool.close()
    finally:
        pool.close()
    assert into is buffer
    for got in (by_routes, by_ids, into, waited):
        assert got.numpy().tobytes() == want.numpy().tobytes()
    with switches.override(STRATA_CPU_POOL_OLD=True):
        old_want = moe_experts(HostExperts(stack.gate, stack.up, stack.down), x, routes, weights, experts)
    assert old.numpy().tobytes() == old_want.numpy().tobytes()
    assert pool.stats.experts == 5 * len(experts) and pool.stats.calls == 5
    with pytest.raises(StrataError, match="cpu_spin_us"):
        CPUExpertPool({0: stack}, spin_us=-1)


@pytest.mark.parametrize("spin_us", [0, 2000])
def test_spinning_worker_runs_jobs_in_order_and_passes_errors_on(spin_us):
    seen = []
    worker = SpinningWorker(1, spin_us, lambda: seen.append("setup"))
    try:
        assert (worker.rounds > 0) == (spin_us > 0)
        futures = [worker.submit(seen.append, i) for i in range(20)]
        failed = worker.submit(lambda: 1 / 0)
        last = worker.submit(lambda a, b: a + b, 2, 3)
        assert last.result(timeout=30) == 5  # posted while the worker spun after the failure: it still ran
        with pytest.raises(ZeroDivisionError):
            failed.result()
        assert all(f.done() for f in futures) and seen == ["setup"] + list(range(20))
    finally:
        worker.shutdown()
    assert worker.taken == worker.posted[0] == 23


def _adapt_reference(cache) -> list:
    """The (expert, slot) admits of the tuple-per-expert adapt that the numpy one replaced, on the cache's state."""
    missing = sorted(((c, (layer, e)) for layer, counts in cache.counts.items() for e, c in enumerate(counts.tolist())
                      if c > 0 and (layer, e) not in cache.slot_of), reverse=True)
    free = cache.free_slots()
    residents = sorted((cache.counts[k[0]][k[1]].item(), s) for s, k in enumerate(cache.owner)
                       if k is not None and k not in cache.in_use)
    admits = []
    for count, key in missing[: cache.adapt_swaps]:
        if free:
            slot = free.pop()
        elif residents and residents[0][0] < count:
            slot = residents.pop(0)[1]
        else:
            break
        admits.append((key, slot))
    return admits


@pytest.mark.parametrize("n_slots,swaps", [(40, 96), (60, 7), (75, 96)])
def test_cache_adapt_admits_what_the_tuple_version_did(n_slots, swaps):
    from strata.engine.expert_cache import ExpertCache

    rng = np.random.default_rng(n_slots)
    one = _stack(("Q4_0",) * 3, rng, n_experts=16, embd=32, ff=32)
    cache = ExpertCache({layer: one for layer in (0, 2, 3, 7, 9)}, n_slots, torch.device("cpu"), adapt_every=10**9,
                        adapt_swaps=swaps)
    cache.fill(cache.even_ranking()[: n_slots - 5])  # five slots left empty
    for step in range(6):
        for layer in (0, 2, 3, 7, 9):
            cache.lookup(layer, sorted(rng.choice(16, 4, replace=False).tolist()))
        if step < 5:
            cache.end_step()  # decayed counts: ties and near-ties between layers and experts
    for layer, counts in cache.counts.items():
        counts[rng.choice(16, 3)] = 1.0  # exact ties, broken by layer then expert
    want = _adapt_reference(cache)
    got = []
    cache.admit_many = got.extend  # adapt admits its swaps as one batch
    assert cache.adapt() == len(want) > 5  # the free slots, then evictions
    assert got == want


def test_bench_calls_prints_a_row_per_call_size(capsys):
    from strata.bench.cpu_experts import main

    assert main(["--calls", "--formats", "Q4_0", "--footprint-mb", "1", "--reps", "1", "--calls-spin", "0,100",
                 "--calls-gap-us", "0"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| Q4_0")]
    assert [row.split("|")[3:5] for row in rows] == [[" 0 ", " 1 "], [" 0 ", " 3 "], [" 0 ", " 10 "],
                                                      [" 100 ", " 1 "], [" 100 ", " 3 "], [" 100 ", " 10 "]]
    assert all("nan" not in row for row in rows)  # every part of the fixed cost was timed


def test_a_worker_whose_setup_fails_raises_instead_of_hanging():
    def setup():
        raise StrataError("no threads here")

    with pytest.raises(StrataError, match="no threads here"):
        SpinningWorker(1, 0, setup)
