"""`--qsa quest` in the engine: bounds kept incrementally equal bounds from scratch; a budget that covers the
context is the dense path byte for byte; a small one runs sparse with a measured cost."""

from __future__ import annotations

import pytest
import torch

import strata
from strata.engine.kv import KVCache
from strata.engine.kv_paged import PagedInt8KV
from strata.engine.quest import QuestSelector
from strata.errors import StrataError
from strata.kernels.select.quest import block_bounds
from strata.models.synthetic import make_model

CPU = torch.device("cpu")
IDS = [(7 * i + 3) % 500 + 5 for i in range(320)]


def _tiny(model_dir, arch: str, head_dim: int):
    path = model_dir / f"quest-{arch}-hd{head_dim}.gguf"
    if path.exists():
        return path
    wide = dict(head_dim=64, n_embd=128) if head_dim == 64 else {}
    return make_model(path, arch=arch, preset="tiny", quant="Q8_0", **wide)


@pytest.mark.parametrize("cache", [KVCache(2, 2, 64, 96, torch.float32, CPU), PagedInt8KV(2, 2, 64, 96, CPU, 8)])
def test_bounds_kept_step_by_step_equal_bounds_from_scratch(cache):
    torch.manual_seed(0)
    cache.selector = QuestSelector(2, 2, 64, CPU, budget=40, block=8, window=8)
    k, q = torch.randn(90, 2, 64), torch.randn(90, 4, 64)
    steps = [(0, 13), (13, 14), (14, 30), (30, 31)]
    for start, end in steps + [(21, 50), (50, 51), (51, 90)]:  # then a rewind to 21 and new keys from there
        if (start, end) == (21, 50):
            cache.truncate(21)
            k[21:] = torch.randn(69, 2, 64)
        cache.reserve(end)
        cache.attend(1, q[start:end], k[start:end], k[start:end], start)
    lo, hi = block_bounds(cache.read_keys(1, 0, 90), 8)
    assert torch.equal(cache.selector.kmin[1][:12], lo.half()) and torch.equal(cache.selector.kmax[1][:12], hi.half())
    assert (cache.read_keys(1, 0, 90) - k).abs().max() < 0.05  # what was read back is the keys (int8: quantized)


def test_a_budget_covering_the_context_is_the_dense_path(model_dir):
    path = _tiny(model_dir, "qwen3moe", 16)
    dense = strata.LLM(path, device="cpu", n_ctx=64, prefill_chunk=16).logits(IDS[:48])
    quest = strata.LLM(path, device="cpu", n_ctx=64, prefill_chunk=16, qsa="quest", qsa_budget=148).logits(IDS[:48])
    assert torch.equal(dense, quest)


def _sparse_logits(path, options, window: int | None = None) -> torch.Tensor:
    llm = strata.LLM(path, **options, qsa="quest", qsa_budget=148)
    if window is not None:
        llm.engine.kv.selector.window = window
    return llm.logits(IDS)


# Measured (tiny random qwen3, int8 KV, 320 tokens, chunks of 64, budget 148: first block 16, window 36), positions
# past the budget, logits error per row relative to its norm: Quest mean 0.29, max 0.52, argmax agreement 64%;
# keeping only the first block and the newest cells (window 128) mean 0.41, max 0.80, 49%. A random model's attention
# is diffuse, so both are far from dense; docs/BENCHMARKS.md has the eval command for a trained model.
def test_a_small_budget_runs_sparse_and_quest_beats_recency(model_dir):
    path = _tiny(model_dir, "qwen3", 64)
    options = dict(device="cpu", kv_dtype="int8", n_ctx=320, prefill_chunk=64)
    dense = strata.LLM(path, **options).logits(IDS)
    quest = _sparse_logits(path, options)
    recency = _sparse_logits(path, options, window=128)
    assert torch.equal(quest[:128], dense[:128])  # the first two chunks see at most 128 cells: dense
    rel = {name: ((x - dense).norm(dim=-1) / dense.norm(dim=-1))[148:] for name, x in
           (("quest", quest), ("recency", recency))}
    assert rel["quest"].min() > 0  # past the budget the selection is sparse
    assert rel["quest"].mean() < 0.8 * rel["recency"].mean(), (rel["quest"].mean(), rel["recency"].mean())


def test_qsa_names_are_checked(model_dir):
    path = _tiny(model_dir, "qwen3moe", 16)
    with pytest.raises(StrataError, match="qsa 'indexer' is not one of none, quest"):
        strata.LLM(path, device="cpu", qsa="indexer")
    with pytest.raises(StrataError, match="qsa_budget 20 is below the cells always kept"):
        strata.LLM(path, device="cpu", qsa="quest", qsa_budget=20)
    with pytest.raises(StrataError, match="decode graphs do not run --kv-resident"):
        strata.LLM(_tiny(model_dir, "qwen3", 64), device="cpu", kv_dtype="int8", qsa="quest", kv_resident=64,
                   decode_graphs="on")


def test_a_restored_checkpoint_gets_its_bounds_back(model_dir):
    """Conversation A, then B (A goes to a checkpoint, B's keys overwrite the cache), then A's next turn: restored
    from the checkpoint, it reads what a cache that only ever held A reads."""
    path = _tiny(model_dir, "qwen3", 64)
    options = dict(device="cpu", kv_dtype="int8", n_ctx=256, prefill_chunk=64, qsa="quest", qsa_budget=148)
    a, b, more = IDS[:200], IDS[100:300], [11, 12, 13, 14, 15, 16, 17, 18]
    engine = strata.LLM(path, **options).engine
    engine.prefill(a)
    engine.prefill(b)
    restored = engine.prefill(a + more)
    assert engine.checkpoints.stats.restored == 1
    only_a = strata.LLM(path, **options).engine
    only_a.prefill(a)
    assert torch.equal(restored, only_a.prefill(a + more))
