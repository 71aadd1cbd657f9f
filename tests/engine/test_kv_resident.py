"""`--kv-resident N`: int8 KV pages in host RAM, N cells per layer on the device with CLOCK eviction. Here host and
"device" are both the CPU (the same code path, copies included): outputs equal the all-VRAM cache's bytes while
pages are evicted and fetched again."""

from __future__ import annotations

import pytest
import torch

import strata
from strata.engine.clock import Clock
from strata.engine.kv_paged import PagedInt8KV
from strata.engine.kv_resident import ResidentInt8KV
from strata.errors import StrataError
from strata.models.synthetic import make_model
from tests.kernels import DEVICE  # on a GPU: the compiled kernels and pinned host pages; here the same code on the CPU

CPU = torch.device("cpu")
IDS = [(7 * i + 3) % 500 + 5 for i in range(224)]


def test_clock_gives_referenced_pages_a_second_chance():
    clock = Clock(3)
    assert clock.admit([10, 11, 12]) == [(10, 0), (11, 1), (12, 2)]
    assert clock.admit([11]) == []  # a hit: 11's bit is set again
    assert clock.admit([13]) == [(13, 0)]  # one sweep clears every bit, the second takes slot 0 (page 10)
    clock.admit([11])
    assert clock.admit([14, 13]) == [(14, 2)]  # slot 1 (11, referenced) is spared, 12 goes; 13 is never a victim
    assert clock.evictions == 2 and int(clock.slot_of_page[12]) == -1
    clock.forget([14])
    assert clock.admit([15]) == [(15, 2)]  # the forgotten page's slot is free again
    with pytest.raises(ValueError, match="4 pages do not fit 3 slots"):
        clock.admit([1, 2, 3, 4])


def _selection(start: int, end: int, seed: int):
    """Each query: its own page and two random earlier pages (at most 3 pages of 4 cells), ascending."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.full((end - start, 12), -1, dtype=torch.int32)
    width = torch.zeros(end - start, dtype=torch.int32)
    for i in range(end - start):
        pos = start + i
        pages = {pos // 4, *torch.randint(0, pos // 4 + 1, (2,), generator=g).tolist()}
        cells = [c for p in sorted(pages) for c in range(4 * p, 4 * p + 4) if c <= pos]
        ids[i, : len(cells)], width[i] = torch.tensor(cells, dtype=torch.int32), len(cells)
    return ids, width


@pytest.mark.parametrize("scratch", [0, None], ids=["query-groups-through-the-slots", "prompt-scratch"])
def test_the_resident_cache_attends_like_the_all_vram_cache_while_evicting(scratch):
    """Chunks whose queries' pages pass the slots: split into groups that fit them (no scratch), or read from a
    scratch pool of their pages in one launch; both the all-VRAM bytes."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(64, heads, 64).to(DEVICE) for heads in (4, 2, 2))
    steps = [(0, 7), (7, 30), (30, 31), (20, 45), (45, 46), (46, 64)]  # (20, 45): a rewind
    device = torch.device(DEVICE)
    resident = ResidentInt8KV(2, 2, 64, 96, device, 24, 8, **({} if scratch is None else {"scratch_bytes": scratch}))
    caches = [PagedInt8KV(2, 2, 64, 96, device, initial_tokens=8), resident]
    outs = [[], []]
    for n, (start, end) in enumerate(steps):
        sel = tuple(t.to(DEVICE) for t in _selection(start, end, n))
        for cache, out in zip(caches, outs):
            if start < len(cache.pages) * 4:
                cache.truncate(start)
            cache.reserve(end)
            for layer in (0, 1):
                dense = cache.attend(layer, q[start:end], k[start:end], v[start:end], start) if end <= 8 else None
                out.append(cache.attend(layer, q[start:end], k[start:end] + layer, v[start:end], start, sel))
                if dense is not None:
                    out.append(dense)
    assert all(torch.equal(a, b) for a, b in zip(*outs))
    assert caches[1].evictions > 20 if scratch == 0 else caches[1].fetches > 4  # pages came and went
    assert caches[1].device_bytes < caches[0].n_bytes / 2
    host, whole = caches[1].pools[1], caches[0].pools[1]
    rows = torch.tensor(caches[1].pages)[:, None] * 8 + torch.arange(8)  # 8 rows a page (2 heads x 4 cells)
    rows_whole = torch.tensor(caches[0].pages)[:, None] * 8 + torch.arange(8)
    assert torch.equal(host.k[rows.flatten()], whole.k.cpu()[rows_whole.flatten()])  # the host holds every page


def test_dense_attention_past_the_resident_cells_is_one_clear_error():
    cache = ResidentInt8KV(1, 1, 64, 64, CPU, 16)
    cache.reserve(20)
    with pytest.raises(StrataError, match="a query attends 20 cells, more than --kv-resident 16 holds"):
        cache.attend(0, torch.randn(20, 2, 64), torch.randn(20, 1, 64), torch.randn(20, 1, 64), 0)


@pytest.fixture(scope="module")
def tiny_qwen3(model_dir):
    path = model_dir / "resident-qwen3-hd64.gguf"
    return path if path.exists() else make_model(path, arch="qwen3", preset="tiny", quant="Q8_0", head_dim=64,
                                                 n_embd=128)


def test_an_engine_with_resident_kv_gives_the_same_logit_bytes(tiny_qwen3):
    """Quest (budget 148) over 224 tokens with 192 cells per layer on the "device": pages come and go."""
    options = dict(device="cpu", kv_dtype="int8", n_ctx=230, prefill_chunk=32, qsa="quest", qsa_budget=148)
    runs = []
    for resident in (None, 192):
        engine = strata.LLM(tiny_qwen3, **options, kv_resident=resident).engine
        logits = [engine.logits(IDS)] + [engine.prefill(IDS + [9] * n) for n in range(1, 4)]  # + one-token steps
        runs.append((torch.cat([x.cpu() for x in logits]), engine.kv))
    assert torch.equal(runs[0][0], runs[1][0])
    # measured 24 (the one-token steps; prompt chunks whose pages pass the slots read a scratch pool instead)
    assert runs[1][1].evictions > 10


def test_resident_kv_needs_int8(tiny_qwen3):
    with pytest.raises(StrataError, match="kv_resident keeps int8 pages in host RAM: it needs kv_dtype int8"):
        strata.LLM(tiny_qwen3, device="cpu", kv_resident=64)


def test_the_long_context_bench_runs_its_arms_and_checks_resident_bytes(tiny_qwen3, capsys):
    from strata.bench.long_context import main

    code = main([str(tiny_qwen3), "--device", "cpu", "--prompt-tokens", "160", "--gen-tokens", "2", "--budget", "148",
                 "--resident", "156", "--prefill", "32"])
    table = capsys.readouterr().out
    assert code == 0, table
    assert "| quest+resident |" in table and "| quest | " in table and "| quest+resident | " in table
    # the resident arm's logits are the all-VRAM arms' (printed before it), byte for byte (on the CPU quest decodes
    # step by step too: the same bytes as quest-steps)
    assert [line.split("|")[7].strip() for line in table.splitlines() if line.startswith("| quest")] == \
        ["-", "quest", "quest, quest-steps"]


class SequentialClock:
    """CLOCK slot by slot, as its definition reads: the reference of Clock's whole-array sweep."""

    def __init__(self, n_slots: int):
        self.page_of_slot, self.referenced = [-1] * n_slots, [False] * n_slots
        self.hand, self.evictions = 0, 0

    def admit(self, pages: list[int]) -> list[tuple[int, int]]:
        loads, wanted = [], set(pages)
        for page in pages:
            if page in self.page_of_slot:
                self.referenced[self.page_of_slot.index(page)] = True
                continue
            slot = self._victim(wanted)
            self.evictions += self.page_of_slot[slot] >= 0
            self.page_of_slot[slot], self.referenced[slot] = page, True
            loads.append((page, slot))
        return loads

    def _victim(self, wanted: set[int]) -> int:
        if -1 in self.page_of_slot:
            return self.page_of_slot.index(-1)
        while True:
            slot, self.hand = self.hand, (self.hand + 1) % len(self.page_of_slot)
            if self.page_of_slot[slot] in wanted:
                continue
            if self.referenced[slot]:
                self.referenced[slot] = False
                continue
            return slot

    def forget(self, pages: list[int]) -> None:
        for slot, page in enumerate(self.page_of_slot):
            if page in pages:
                self.page_of_slot[slot], self.referenced[slot] = -1, False


def test_the_whole_array_sweep_is_clock_slot_by_slot():
    g = torch.Generator().manual_seed(3)
    fast, slow = Clock(16), SequentialClock(16)
    for step in range(300):
        if step % 37 == 36:
            gone = torch.randint(0, 40, (5,), generator=g).tolist()
            fast.forget(gone)
            slow.forget(gone)
            continue
        n = int(torch.randint(1, 17, (1,), generator=g))
        pages = torch.randperm(40, generator=g)[:n].tolist()
        assert fast.admit(pages) == slow.admit(pages), step
        assert fast.page_of_slot.tolist() == slow.page_of_slot and fast.hand == slow.hand
    assert fast.evictions == slow.evictions > 500


class OpCount(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def test_a_prompt_chunk_goes_to_the_host_in_bulk_and_a_step_fetches_in_one_copy():
    """A chunk's pages: the same ops for 8 or 64 cells (one packed copy, not one per page or cell) and no CLOCK
    admission; a one-token step that misses pages fetches them all in one copy per layer."""
    torch.manual_seed(0)
    cache = ResidentInt8KV(1, 2, 64, 256, CPU, 32)
    cache.reserve(200)
    counts = []
    for start, end in ((0, 64), (64, 72), (72, 136)):  # the first sizes the staging buffer
        k = torch.randn(end - start, 2, 64)
        with OpCount() as count:
            cache._store(0, start, k, k, kernels=False)
        counts.append(count.ops)
    assert counts[1] == counts[2] and cache.evictions == 0 and cache.fetches == 0
    ids = torch.tensor([[0, 1, 2, 3, 64, 65, 130, 136]], dtype=torch.int32)  # pages 0, 16, 32 missing; 34: the step's
    out = cache.attend(0, torch.randn(1, 4, 64), torch.randn(1, 2, 64), torch.randn(1, 2, 64), 136,
                       (ids, torch.tensor([8], dtype=torch.int32)))
    assert out.isfinite().all() and cache.fetches == 2  # the step's own page (written through), then the three
