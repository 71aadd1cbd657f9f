"""A checkpoint's host memory pinned ahead of its save (engine/idle_work.py, CheckpointStore.reserve_pieces): the
sizes a save will copy, known before the prompt; the save taking the reserved slabs; the pieces run only while the
awaited event has not fired."""

import pytest
import torch

import strata
from strata.engine import checkpoints
from strata.engine.checkpoints import CheckpointStore, HostCopies, slabs_for, snapshot_sizes
from strata.engine.idle_work import IdleWork
from strata.models.synthetic import make_model


class RecordingCopies(HostCopies):
    def __init__(self, reserve=None):
        super().__init__(reserve)
        self.sizes = []

    def copy(self, t):
        self.sizes.append(t.numel() * t.element_size())
        return super().copy(t)


@pytest.fixture(scope="module")
def models(model_dir, tiny_moe):
    # head_dim 64 where the KV is int8: it rounds groups of 64 values
    return {"qwen3moe": tiny_moe,
            "qwen3moe-hd64": make_model(model_dir / "ahead-qwen3moe-hd64.gguf", arch="qwen3moe", preset="tiny",
                                        quant="Q8_0", head_dim=64, n_embd=128),
            "qwen3next": make_model(model_dir / "ahead-qwen3next.gguf", arch="qwen3next", preset="tiny", quant="Q8_0",
                                    head_dim=64),
            "qwen4exp": make_model(model_dir / "ahead-qwen4exp.gguf", arch="qwen4exp", preset="tiny", quant="F32")}


@pytest.mark.parametrize("arch, kv_dtype", [("qwen3moe", "float32"), ("qwen3moe-hd64", "int8"),
                                            ("qwen3next", "int8"), ("qwen4exp", "float32")])
def test_the_sizes_known_before_a_prompt_are_the_bytes_its_snapshot_copies(models, arch, kv_dtype):
    llm = strata.LLM(models[arch], device="cpu", kv_dtype=kv_dtype, checkpoints=0)
    engine = llm.engine
    ids = torch.randint(3, 500, (70,), generator=torch.Generator().manual_seed(1)).tolist()
    engine.kv.truncate(0)
    predicted = snapshot_sizes(engine.kv, len(ids))  # the buffers still empty: they grow while the prompt is read
    engine.prefill(ids)
    copies = RecordingCopies()
    state, n_bytes = checkpoints.snapshot(engine.kv, len(ids), copies)
    assert predicted == copies.sizes and sum(predicted) == n_bytes > 0


def test_slabs_for_counts_what_the_copies_fill():
    slab = 1 << 20
    sizes = [300_000, 300_000, 300_000, 500_000, 3 << 20, 1 << 20, 10]
    copies = HostCopies([torch.empty(slab, dtype=torch.uint8) for _ in range(8)])
    for n in sizes:
        copies.copy(torch.zeros(n, dtype=torch.uint8))
    assert slabs_for(sizes, slab) == 8 - len(copies.reserve) == 4  # the 3 MiB tensor: its own allocation


def test_a_save_takes_the_slabs_reserved_ahead_and_keeps_every_value(models):
    llm = strata.LLM(models["qwen4exp"], device="cpu", checkpoints=0)
    engine = llm.engine
    ids = torch.randint(3, 500, (40,), generator=torch.Generator().manual_seed(2)).tolist()
    engine.prefill(ids)
    store = CheckpointStore(4, 1 << 30)
    pieces = store.reserve_pieces(engine.kv, len(ids), pinned=False)
    assert pieces and not store.reserve
    for piece in pieces:
        piece()
    reserved = {slab.data_ptr(): slab.numel() for slab in store.reserve}
    assert len(reserved) == len(pieces) and store.stats.reserved_bytes == sum(reserved.values())
    assert store.reserve_pieces(engine.kv, len(ids), pinned=False) == []  # nothing more to pin for the same save
    store.save(ids, engine.kv)
    assert not store.reserve  # every slab taken
    saved = store.items[tuple(ids)]
    fresh = strata.LLM(models["qwen4exp"], device="cpu", checkpoints=0)
    checkpoints.restore(fresh.engine.kv, saved.state)
    again = checkpoints.snapshot(fresh.engine.kv, len(ids))[0]
    mine = checkpoints.snapshot(engine.kv, len(ids))[0]
    assert _flat(again) == _flat(mine)  # the restored cache holds what the live one holds, bit for bit
    within = [t for t in _tensors(saved.state)
              if any(p <= t.untyped_storage().data_ptr() < p + n for p, n in reserved.items())]
    assert sum(t.numel() * t.element_size() for t in within) == saved.n_bytes  # every copy in a reserved slab


def test_idle_work_runs_pieces_until_the_event_fires_then_waits():
    class Event:
        def __init__(self, fires_after):
            self.queries, self.fires_after, self.synced = 0, fires_after, False

        def query(self):
            self.queries += 1
            return self.queries > self.fires_after

        def synchronize(self):
            self.synced = True

    ran = []
    idle = IdleWork()
    idle.add([lambda i=i: ran.append(i) for i in range(5)])
    event = Event(fires_after=2)
    idle.wait(event)
    assert ran == [0, 1] and event.synced and len(idle.pieces) == 3 and idle.done == 2
    idle.wait(Event(fires_after=10))
    assert ran == [0, 1, 2, 3, 4] and not idle.pieces
    idle.add([lambda: ran.append("late")])
    idle.clear()
    idle.wait(Event(fires_after=10))
    assert "late" not in ran


def _tensors(state):
    if isinstance(state, torch.Tensor):
        yield state
    elif isinstance(state, dict):
        for v in state.values():
            yield from _tensors(v)
    elif isinstance(state, (list, tuple)):
        for v in state:
            yield from _tensors(v)


def _flat(state):
    return [t.numpy().tobytes() for t in _tensors(state)]
