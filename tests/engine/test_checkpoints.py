"""Conversation checkpoints: a follow-up restores its conversation's cache (KV cells, GatedDeltaNet states) after
others used the engine, reads only its new tokens, and gets the logits a fresh full prompt gets."""

from __future__ import annotations

import pytest
import torch

import strata
from strata.engine.checkpoints import CheckpointStore, usable_prefix
from strata.engine.sampling import SamplingParams
from strata.models.synthetic import make_model
from tests.serve.models import make_tool_model

BOUND = 1e-5  # relative to the largest logit, F32 weights and KV: the restored path vs one pass over the prompt


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _relative_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen3next"])
def test_restored_conversation_gives_the_logits_of_a_fresh_full_prompt(hf_exports, arch):
    _, path = hf_exports.get(arch, "F32")
    engine = strata.LLM(path, device="cpu", kv_dtype="float32").engine
    a, b = _tokens(30, seed=1), _tokens(25, seed=2)
    a_next = a + _tokens(9, seed=3)
    engine.prefill(a)
    engine.prefill(b)  # another conversation takes the cache
    assert engine.reuse(a_next).tokens == len(a) and engine.reuse(a_next).checkpoint is not None
    restored = engine.prefill(a_next)
    assert engine.checkpoints.stats.restored == 1 and engine.checkpoints.stats.restored_tokens == len(a)
    assert engine.cached_tokens == a_next
    fresh = strata.LLM(path, device="cpu", kv_dtype="float32").logits(a_next)[-1:]
    assert _relative_error(restored, fresh) < BOUND
    # And the restored cache is the saved one bit for bit: the same logits as continuing the live cache.
    live = strata.LLM(path, device="cpu", kv_dtype="float32").engine
    live.prefill(a)
    assert torch.equal(live.prefill(a_next), restored)


def test_int8_paged_cache_restores_its_pages_bit_for_bit(model_dir):
    path = model_dir / "ckpt-qwen3moe-hd64.gguf"
    if not path.exists():
        make_model(path, arch="qwen3moe", preset="tiny", quant="Q8_0", head_dim=64, n_embd=128)
    a, b = _tokens(30, seed=4), _tokens(22, seed=5)
    a_next = a + _tokens(6, seed=6)
    engine = strata.LLM(path, device="cpu", kv_dtype="int8").engine
    engine.prefill(a)
    engine.prefill(b[:3] + a[3:])  # rewinds to 0: other pages, other codes
    engine.prefill(b)
    restored = engine.prefill(a_next)
    assert engine.checkpoints.stats.restored == 1
    live = strata.LLM(path, device="cpu", kv_dtype="int8").engine
    live.prefill(a)
    assert torch.equal(live.prefill(a_next), restored)


def test_hybrid_model_restores_the_end_of_the_prompt_when_the_reply_is_rendered_anew(hf_exports):
    """A recurrent state cannot be rewound: the checkpoint at the end of the prompt serves the next turn, whose
    prompt holds the reply re-rendered (here: other tokens than were generated)."""
    _, path = hf_exports.get("qwen3next", "F32")
    engine = strata.LLM(path, device="cpu", kv_dtype="float32").engine
    prompt = _tokens(20, seed=7)
    generated = list(engine.generate(prompt, SamplingParams(temperature=0), 5))
    assert engine.cached_tokens[: len(prompt) + 1] == prompt + generated[:1]
    follow = prompt + _tokens(7, seed=8)  # the reply as the template writes it back, and the next question
    assert engine.reuse(follow).tokens == len(prompt)
    restored = engine.prefill(follow)
    fresh = strata.LLM(path, device="cpu", kv_dtype="float32").logits(follow)[-1:]
    assert _relative_error(restored, fresh) < BOUND


@pytest.fixture(scope="module")
def tool_model(model_dir):
    path = model_dir / "tiny-qwen3moe-tools.gguf"
    return path if path.exists() else make_tool_model(path)


def _alternate(llm, turns: int = 3) -> list[tuple[int, int]]:
    """Two chats taking turns: (the chat's previous prompt's tokens, this prompt's tokens not read) per turn. (The
    random model's replies need not tokenize back as generated, so the previous prompt is what must be reused.)"""
    chats = [[{"role": "user", "content": "Tell me about rivers and the sea."}],
             [{"role": "user", "content": "What do mountains look like in winter?"}]]
    previous, seen = [0, 0], []
    for turn in range(turns):
        for i, messages in enumerate(chats):
            out = llm.chat(messages, max_tokens=4, temperature=0)
            seen.append((previous[i], out.stats.cached_tokens))
            previous[i] = out.stats.prompt_tokens
            messages += [{"role": "assistant", "content": out.text}, {"role": "user", "content": f"More {turn}."}]
    return seen


def test_alternating_chats_read_only_their_new_tokens(tool_model):
    llm = strata.LLM(tool_model, device="cpu")
    seen = _alternate(llm)
    assert all(cached >= before for before, cached in seen[2:])  # each follow-up: its history restored
    stats = llm.engine.checkpoints.stats
    assert stats.restored == 4 and stats.restored_tokens >= sum(before for before, _ in seen)
    without = _alternate(strata.LLM(tool_model, device="cpu", checkpoints=0))
    assert all(cached < before for before, cached in without[2:])  # only the live cache: a few template tokens


def test_a_checkpoint_dropped_to_make_room_for_the_conversation_it_replaces_still_restores(tool_model):
    """One checkpoint allowed: leaving B saves B, which drops A, the very checkpoint the prompt is about to use."""
    llm = strata.LLM(tool_model, device="cpu", checkpoints=1)
    a, b = _tokens(20, seed=9), _tokens(15, seed=10)
    llm.engine.prefill(a)
    llm.engine.prefill(b)
    restored = llm.engine.prefill(a + [7, 8])
    assert list(llm.engine.checkpoints.items) == [tuple(b)] and llm.engine.checkpoints.stats.restored == 1
    assert llm.engine.checkpoints.n_bytes == next(iter(llm.engine.checkpoints.items.values())).n_bytes
    live = strata.LLM(tool_model, device="cpu", checkpoints=0).engine
    live.prefill(a)
    assert torch.equal(live.prefill(a + [7, 8]), restored)


@pytest.mark.parametrize("kv_dtype", ["float32", "int8"])
def test_a_quest_selection_sees_the_restored_keys(model_dir, kv_dtype):
    """`--qsa quest` keeps bounds of the keys it saw; after a restore they must describe the restored keys."""
    path = model_dir / "ckpt-qwen3moe-hd64.gguf"
    if not path.exists():
        make_model(path, arch="qwen3moe", preset="tiny", quant="Q8_0", head_dim=64, n_embd=128)
    options = dict(device="cpu", kv_dtype=kv_dtype, qsa="quest", qsa_budget=40)  # prompts past the budget select
    a, b = _tokens(70, seed=11), _tokens(64, seed=12)
    engine = strata.LLM(path, **options).engine
    engine.prefill(a)
    engine.prefill(b)
    restored = engine.prefill(a + [5, 6, 7])
    assert engine.checkpoints.stats.restored == 1
    live = strata.LLM(path, **options).engine
    live.prefill(a)
    assert torch.equal(live.prefill(a + [5, 6, 7]), restored)


def test_no_checkpoints_when_switched_off(tool_model):
    llm = strata.LLM(tool_model, device="cpu", checkpoints=0)
    a, b = [5, 6, 7, 8, 9], [9, 8, 7]
    llm.engine.prefill(a)
    llm.engine.prefill(b)
    assert llm.engine.checkpoints is None and llm.engine.reuse(a + [1]).tokens == 0


# ---- the store's rules, on a fake cache ----


class FakeKV:
    """Stands for a cache whose snapshots cost 10 bytes a token."""

    can_truncate = True


@pytest.fixture
def fake_kinds(monkeypatch):
    from strata.engine import checkpoints

    monkeypatch.setattr(checkpoints, "supports", lambda cache: True)
    monkeypatch.setattr(checkpoints, "snapshot", lambda cache, n, host=None: (n, 10 * n))
    monkeypatch.setattr(checkpoints, "restore", lambda cache, state: None)
    return checkpoints


def test_store_drops_the_least_recently_used_past_its_count_and_bytes(fake_kinds):
    store = CheckpointStore(max_count=2, max_bytes=1000)
    kv = FakeKV()
    store.save([1, 2, 3], kv)
    store.save([4, 5, 6], kv)
    store.best([4, 5, 9], True)  # looking is not using...
    store.restore(store.best([1, 2, 3, 9], True).checkpoint, kv, 3)  # ...restoring is
    store.save([7, 8], kv)
    assert list(store.items) == [(1, 2, 3), (7, 8)] and store.stats.evicted == 1
    store.save(list(range(60)), kv)  # 600 bytes: the others must make room
    assert list(store.items) == [(7, 8), tuple(range(60))] and store.n_bytes == 620
    store.save(list(range(200)), kv)  # larger than the whole budget: not kept, nothing dropped for it
    assert len(store) == 2


def test_store_keeps_one_checkpoint_per_line_of_a_rewindable_conversation(fake_kinds):
    store = CheckpointStore(max_count=4, max_bytes=10_000)
    kv = FakeKV()
    store.save([1, 2, 3], kv)
    store.save([1, 2, 3, 4, 5], kv)  # extends it: replaces it
    store.save([1, 2], kv)  # served by the longer one: not copied again
    assert list(store.items) == [(1, 2, 3, 4, 5)] and store.stats.saved == 2
    found = store.best([1, 2, 3, 9, 9], True)
    assert found.tokens == 3 and found.checkpoint.tokens == (1, 2, 3, 4, 5)
    assert store.best([1, 2, 3, 4, 5], True).tokens == 4  # the last token is always read again

    hybrid = CheckpointStore(max_count=4, max_bytes=10_000)
    kv.can_truncate = False
    hybrid.save([1, 2, 3], kv)
    hybrid.save([1, 2, 3, 4, 5], kv)  # a state at 3 tokens is not one at 5: both kept
    assert len(hybrid) == 2 and hybrid.best([1, 2, 3, 4, 9], False).tokens == 3
    assert hybrid.best([1, 2, 3, 4, 5, 6], False).tokens == 5 and hybrid.best([1, 2, 7], False).tokens == 0


def test_usable_prefix():
    assert usable_prefix([1, 2, 3], [1, 2, 3, 4], True) == 3
    assert usable_prefix([1, 2, 3], [1, 2, 3], True) == 2
    assert usable_prefix([1, 2, 3], [1, 2, 3], False) == 0
    assert usable_prefix([1, 2, 5], [1, 2, 3, 4], False) == 0
    assert usable_prefix([], [1], False) == 0


def test_host_copies_share_a_few_slabs_and_keep_every_value():
    from strata.engine.checkpoints import HostCopies

    copies = HostCopies()
    gen = torch.Generator().manual_seed(0)
    sources = [torch.randn(n, generator=gen).to(dtype) for n, dtype in
               [(3, torch.float16), (1000, torch.float32), (5, torch.int8), (7, torch.bfloat16), (0, torch.float32),
                (3_000_000, torch.float32), (11, torch.int64)]]
    sources.append(torch.randn(4, 6, generator=gen)[:, ::2])  # a strided view copies as its values
    held = [copies.copy(t) for t in sources]
    for source, copy in zip(sources, held):
        assert copy.dtype == source.dtype and copy.shape == source.shape and torch.equal(copy, source)
        assert copy.storage_offset() * copy.element_size() % HostCopies.ALIGN == 0  # aligned for any dtype
    bases = {copy.untyped_storage().data_ptr() for copy in held}
    assert len(bases) == 2  # the 12 MB tensor in its own; the others in the first 4 MiB slab
    sources[1].zero_()
    assert held[1].abs().sum() > 0  # copies, not views of the sources
