"""Long-context decode through the captured step (engine/decode.py's CPU form): `--qsa quest` selects on the device
inside the static step, with the step-by-step engine's bytes, and a step's host work does not grow with the context
(the same torch ops at two context lengths, and no read back to the host, where the eager step reads one a layer)."""

from __future__ import annotations

import os
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import strata.kernels  # noqa: F401  (the interpreter switch, before Triton is imported)
from strata.engine.decode import GraphDecoder
from strata.engine.engine import Engine, EngineConfig
from strata.models.synthetic import make_model

IDS = [(7 * i + 3) % 500 + 5 for i in range(400)]
QUEST = dict(device="cpu", kv_dtype="int8", prefill_chunk=64, qsa="quest", qsa_budget=148)


@pytest.fixture(scope="module")
def wide_qwen3(model_dir):
    path = model_dir / "longdecode-qwen3-hd64.gguf"
    return path if path.exists() else make_model(path, arch="qwen3", preset="tiny", quant="Q8_0", head_dim=64,
                                                 n_embd=128)


@pytest.fixture(scope="module")
def wide_next(model_dir):
    path = model_dir / "longdecode-qwen3next-hd64.gguf"
    return path if path.exists() else make_model(path, arch="qwen3next", preset="tiny", quant="Q8_0", head_dim=64,
                                                 n_embd=128)


def _decode(engine: Engine, prompt: list[int], steps: int) -> list[bytes]:
    logits, history, out = engine.prefill(prompt), list(prompt), []
    for _ in range(steps):
        token = int(logits[-1].argmax())
        history.append(token)
        logits = engine.decode(token, len(history) - 1)
        out.append(logits.numpy().tobytes())
    return out


@pytest.mark.parametrize("arch", ["qwen3", "qwen3next"])
def test_quest_decode_in_the_static_step_is_the_engines_step(wide_qwen3, wide_next, arch):
    """Steps seeing 145..148 cells are dense (within the budget), 149..152 select: both the eager engine's bytes."""
    path = wide_qwen3 if arch == "qwen3" else wide_next
    eager = Engine(path, EngineConfig(n_ctx=256, **QUEST))
    static = Engine(path, EngineConfig(n_ctx=256, decode_graphs="eager", **QUEST))
    assert eager.decoder is None and type(static.decoder) is GraphDecoder
    assert _decode(static, IDS[:144], 8) == _decode(eager, IDS[:144], 8)
    assert static.decoder.steps == 8


def test_quest_over_the_graphs_span_selects_the_same_cells(wide_qwen3):
    """What the graphs run: Quest scores a power-of-two span whose cells past the position score -inf, so the
    selection, and the logits past the budget, are the exact-span step's bytes."""
    eager = Engine(wide_qwen3, EngineConfig(n_ctx=512, **QUEST))
    spanned = Engine(wide_qwen3, EngineConfig(n_ctx=512, **QUEST))
    spanned.decoder = GraphDecoder(spanned.model, spanned.kv, spanned.device, capture=False, exact_span=False)
    assert _decode(spanned, IDS[:200], 4) == _decode(eager, IDS[:200], 4)
    assert spanned.kv.selector.kmin[0].shape[0] == 512 // 16  # covered for the whole context before the steps


class OpCount(TorchDispatchMode):
    """Every torch op dispatched, by name."""

    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def _ops_of_step(engine: Engine, position: int, step) -> Counter:
    """The ops of one step at `position`, run with the Triton kernels as on the GPU (the interpreter here), not the
    CPU references (which read back to the host); the prompt before it with the references (quicker)."""
    engine.prefill(IDS[:position])
    engine.kv.kernels = True
    try:
        with OpCount() as count:
            step(7, position)
    finally:
        engine.kv.kernels = None
    return count.ops


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="runs the Triton kernels on CPU tensors")
def test_a_quest_step_reads_nothing_back_and_does_not_grow_with_the_context(wide_qwen3):
    """The static step: the same ops at 200 and 390 cells (spans 256 and 512), none a read back to the host
    (`_local_scalar_dense`: a device sync on a GPU). The eager step reads the context's length back in every layer's
    Quest scoring (what the captured step removed)."""
    engine = Engine(wide_qwen3, EngineConfig(n_ctx=512, **QUEST))
    engine.decoder = GraphDecoder(engine.model, engine.kv, engine.device, capture=False, exact_span=False)
    _ops_of_step(engine, 199, engine.decode)  # the first step reserves the context and sizes the Quest tables
    short, long = (_ops_of_step(engine, n, engine.decode) for n in (200, 390))
    assert short == long and "aten._local_scalar_dense" not in short
    eager = _ops_of_step(engine, 390, lambda token, pos: engine._forward([token], pos, all_logits=False))
    assert eager["aten._local_scalar_dense"] >= engine.model.config.n_layers


def test_verify_windows_select_with_quest_like_step_by_step_speculation(model_dir):
    """MTP speculation over quest: windows of 3 rows in the static step (each row its own selection) accept the
    tokens step-by-step speculation accepts, past the budget."""
    from strata.engine.sampling import SamplingParams

    path = model_dir / "longdecode-qwen3next-mtp-hd64.gguf"
    if not path.exists():
        make_model(path, arch="qwen3next", preset="tiny", quant="Q8_0", nextn_layers=1, head_dim=64, n_embd=128)
    options = dict(n_ctx=256, spec=3, **QUEST)
    eager = Engine(path, EngineConfig(decode_graphs="off", **options))
    static = Engine(path, EngineConfig(decode_graphs="eager", **options))
    assert eager.spec.windows is None and static.spec.windows is not None
    greedy = SamplingParams(temperature=0)
    assert list(static.generate(IDS[:150], greedy, 8)) == list(eager.generate(IDS[:150], greedy, 8))


def test_a_step_that_opens_a_page_writes_one_table_entry():
    """The int8 cache's page table grows in place (a decode step opening a page writes its entry, not the context's
    whole table); truncating and growing again rewrites only the entries past the kept ones."""
    from strata.engine.kv_paged import PagedInt8KV

    cache = PagedInt8KV(1, 1, 64, 4096, torch.device("cpu"), initial_tokens=64)
    cache.reserve(2001)
    cache.reserve(2005)  # 502 pages: the table's room doubles from 501 to 1002
    storage = cache.page_table.data_ptr()
    for n_tokens in (2009, 2013, 1200, 3000):
        if n_tokens < len(cache.pages) * 4:
            cache.truncate(n_tokens)
        cache.reserve(n_tokens)
        assert torch.equal(cache.page_table, torch.tensor(cache.pages, dtype=torch.int32))
    assert cache.page_table.data_ptr() == storage
