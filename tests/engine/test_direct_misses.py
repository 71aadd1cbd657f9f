"""`--misses direct`: the GPU reads the experts its cache lacks from pinned host RAM, with no host in the step.
On the CPU the same code path runs (device table, device counts, one segment per step): the tokens and bytes of
resident experts, a table that follows the cache, exact counts."""

import pytest
import torch

import strata
from strata.engine.direct_misses import direct_gemv
from strata.engine.engine import Engine, EngineConfig
from strata.engine.experts import ResidentExperts
from strata.engine.sampling import SamplingParams
from strata.errors import StrataError
from strata.models.layers import route_topk
from strata.models.synthetic import make_model

PROMPT = [5, 17, 99, 3, 250, 7, 31]


def _decode(path, steps=12, **options):
    engine = Engine(path, EngineConfig(device="cpu", **options))
    tokens = list(engine.generate(PROMPT, SamplingParams(temperature=0), steps))
    logits = engine.decode(tokens[-1], len(PROMPT) + len(tokens) - 1)
    return engine, tokens, logits.numpy().tobytes()


def _direct_layer(tmp_path, quant: str, n_tokens: int, seed: int):
    """A tiny model behind a 5-slot cache with direct misses: (its expert backend, its first routed layer, x, and a
    random routing of n_tokens rows)."""
    path = make_model(tmp_path / "m.gguf", preset="tiny", quant=quant, n_embd=128, expert_ff=64)
    llm = strata.LLM(path, device="cpu", expert_cache=5, misses="direct")
    backend = llm.engine.model.experts
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_tokens, 128, generator=g)
    weights, ids = route_topk(torch.randn(n_tokens, llm.config.n_experts, generator=g), llm.config.n_experts_used,
                              True)
    return backend, next(iter(backend.host_stacks)), x, weights, ids


@pytest.mark.parametrize("graphs", ["off", "eager"])
def test_direct_misses_give_the_resident_tokens_and_bytes(tiny_moe, graphs):
    _, want_tokens, want_logits = _decode(tiny_moe, decode_graphs=graphs)
    engine, tokens, logits = _decode(tiny_moe, decode_graphs=graphs, expert_cache=3, misses="direct")
    assert engine.model.experts.direct and (tokens, logits) == (want_tokens, want_logits)
    if graphs == "eager":  # the static step has one segment, as with resident experts: no host between layers
        assert engine.decoder.cached is None
        assert all(not runner.program.routed for runner in engine.decoder.programs.values())


def test_the_device_table_follows_the_cache_and_counts_exactly(tiny_moe, monkeypatch):
    from strata.engine.direct_misses import DeviceTable

    pairs = []
    count = DeviceTable.count
    monkeypatch.setattr(DeviceTable, "count", lambda self, layer, ids: (pairs.append(ids.numel()),
                                                                        count(self, layer, ids)))
    engine, tokens, _ = _decode(tiny_moe, steps=13, expert_cache=4, misses="direct")
    cache = engine.model.experts.cache
    table = cache.device_table
    table.read_stats()
    table.publish()
    landed = {(layer, e): slot for (layer, e), slot in cache.slot_of.items()}
    entries = {(layer, e): int(table.host[row, e]) for layer, row in table.row.items()
               for e in range(table.host.shape[1]) if table.host[row, e] >= 0}
    assert entries == landed and torch.equal(table.table.cpu(), table.host)
    assert torch.equal(table.missing, torch.where(table.table >= 0, -1, table.expert_ids))  # its complement
    c = engine.model.config
    assert sum(pairs) >= (len(PROMPT) + len(tokens)) * c.n_experts_used * len(table.row)  # every token, every layer
    assert cache.stats.hits + cache.stats.misses == sum(pairs) and cache.stats.hits > 0 and cache.stats.swaps > 0


def test_an_evicted_expert_reads_from_the_host_at_once(tiny_moe):
    llm = strata.LLM(tiny_moe, device="cpu", expert_cache=2, misses="direct")
    cache = llm.engine.model.experts.cache
    table = cache.device_table
    (old, slot), = [(k, s) for k, s in cache.slot_of.items() if s == 0]
    new = next((layer, e) for layer in table.row for e in range(table.host.shape[1]) if (layer, e) not in cache.slot_of)
    cache.admit(new, slot)
    assert table.host[table.row[old[0]], old[1]] == -1 and table.table[table.row[old[0]], old[1]] == -1
    table.publish()  # the CPU's copy landed at once: the new entry enters at the next publish
    assert table.host[table.row[new[0]], new[1]] == slot == table.table[table.row[new[0]], new[1]]


def test_the_two_launches_sum_to_the_loop(tmp_path):
    """direct_gemv's hits (slots) + misses (host stack) through complementary tables = every expert once."""
    backend, layer, x, weights, ids = _direct_layer(tmp_path, "Q8_0", n_tokens=3, seed=1)
    hits = [e for e in ids.unique().tolist() if (layer, e) in backend.cache.slot_of]
    assert 0 < len(hits) < ids.unique().numel()  # some hits, some misses
    want = ResidentExperts(backend.host_stacks).run(layer, x, weights, ids)
    got = direct_gemv(backend.cache, backend.host_stacks[layer], layer, x, weights, ids)
    assert ((got - want).norm() / want.norm()).item() < 1e-5


def test_bad_miss_path_is_one_line(tiny_moe):
    with pytest.raises(StrataError, match="--misses must be one of auto, cpu, direct"):
        strata.LLM(tiny_moe, device="cpu", expert_cache=3, misses="gpu")


def test_auto_reads_misses_directly_only_on_a_gpu_with_pinned_experts(tiny_moe):
    from types import SimpleNamespace

    from strata.engine.experts import miss_path

    def stacks(pinned):
        return {0: SimpleNamespace(gate=SimpleNamespace(raw=SimpleNamespace(is_pinned=lambda: pinned)))}

    assert miss_path("auto", torch.device("cuda"), stacks(True)) == "direct"
    assert miss_path("auto", torch.device("cuda"), stacks(False)) == "cpu"  # --no-pin-experts
    assert miss_path("auto", torch.device("cpu"), stacks(False)) == "cpu"
    assert miss_path("cpu", torch.device("cuda"), stacks(True)) == "cpu"
    assert not strata.LLM(tiny_moe, device="cpu", expert_cache=3).engine.model.experts.direct


def test_the_device_counter_takes_the_largest_direct_step(tiny_moe):
    """A short prompt (under the prompt kernels' 32 tokens) also runs direct: 31 rows of as many pairs as experts."""
    from strata.engine.experts import PROMPT_KERNEL_MIN_TOKENS

    cache = strata.LLM(tiny_moe, device="cpu", expert_cache=3, misses="direct").engine.model.experts.cache
    table = cache.device_table
    layer, n_experts = next(iter(table.row)), table.host.shape[1]
    ids = torch.arange((PROMPT_KERNEL_MIN_TOKENS - 1) * n_experts) % n_experts
    table.count(layer, ids.reshape(-1, n_experts))
    assert torch.equal(table.routed[table.row[layer]], torch.bincount(ids, minlength=table.host.shape[1]).float())


def test_copied_misses_sum_like_misses_read_in_place(tmp_path):
    """STRATA_MISSES_COPY: the misses copied into scratch slots (the CPU form of the gather launch) then the GEMVs
    over them give the in-place result; the scratch holds exactly the missed experts' bytes, a slot each."""
    from strata import switches

    backend, layer, x, weights, ids = _direct_layer(tmp_path, "Q4_0", n_tokens=2, seed=2)
    cache, stack = backend.cache, backend.host_stacks[layer]
    in_place = direct_gemv(cache, stack, layer, x, weights, ids)
    with switches.override(STRATA_MISSES_COPY=True):
        cache.device_table.copy_misses = True
        copied = direct_gemv(cache, stack, layer, x, weights, ids)
    assert ((copied - in_place).norm() / in_place.norm()).item() < 1e-6
    (scratch,) = cache.device_table.scratch.values()
    flat = ids.reshape(-1).tolist()
    missed = [p for p, e in enumerate(flat) if (layer, e) not in cache.slot_of and flat.index(e) == p]
    assert missed and len(missed) < len(flat)
    gate = stack.gate.raw.reshape(stack.n_experts, -1)
    for p in missed:
        assert torch.equal(scratch[p, : gate.shape[1]], gate[flat[p]])


def test_copied_misses_scratch_is_shared_by_the_steps_it_fits(tiny_moe):
    """A buffer made for a step is kept (a graph holds its address) and lent to every smaller step; a larger step
    gets its own."""
    from strata.kernels.moe.gemv import DecodeExperts

    backend = strata.LLM(tiny_moe, device="cpu", expert_cache=3, misses="direct").engine.model.experts
    table = backend.cache.device_table
    host = DecodeExperts.of_stack(next(iter(backend.host_stacks.values())))
    eight, _ = table.miss_scratch(8, host)
    four, _ = table.miss_scratch(4, host)
    twelve, _ = table.miss_scratch(12, host)
    assert four.shape[0] == 4 and four.data_ptr() == eight.data_ptr()
    assert twelve.shape[0] == 12 and twelve.data_ptr() != eight.data_ptr() and len(table.scratch) == 2
    assert table.miss_scratch(8, host)[0].data_ptr() == eight.data_ptr()  # the smallest that fits
