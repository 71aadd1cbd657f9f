"""qwen4exp on the tiny synthetic model: prompt path against decode, its parts against float64 references, the n-gram
hash against hand-computed rows, the selection hand-off to the KV backend, and bad files and caches."""

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import strata
from strata.engine.context import ForwardContext
from strata.engine.qwen4exp_cache import IndexerKeys
from strata.errors import StrataError
from strata.gguf.reader import GGUFModelFile
from strata.gguf.writer import TensorSpec, write_gguf
from strata.kernels.select.keys import pool_block_keys
from strata.models import load_model
from strata.models.synthetic import make_model
from strata.models.synthetic_qwen4exp import shard_paths

CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("qwen4exp") / "tiny.gguf", arch="qwen4exp", preset="tiny", quant="F32")


def _tokens(n: int, seed: int = 0) -> list[int]:
    return torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _relative_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours - ref).abs().max() / ref.abs().max()).item()


def test_prompt_logits_equal_token_by_token_logits(tiny):
    model = load_model(GGUFModelFile(tiny), CPU, torch.float32)
    ids = _tokens(30, seed=1)
    cache = model.new_cache(64, torch.float32)
    whole = model.forward(torch.tensor(ids), ForwardContext(cache, 0, len(ids), want_all_logits=True))
    assert whole.shape == (30, 512) and whole.isfinite().all()
    steps = torch.cat([model.forward(torch.tensor([t]), ForwardContext(cache, i, 1)) for i, t in enumerate(ids)])
    assert _relative_error(steps, whole) < 1e-4
    chunks = torch.cat([model.forward(torch.tensor(ids[i : i + 7]), ForwardContext(cache, i, len(ids[i : i + 7]),
                                                                                   want_all_logits=True))
                        for i in range(0, 30, 7)])
    assert _relative_error(chunks, whole) < 1e-4


def test_greedy_decode_picks_the_prompt_paths_argmax(tiny):
    llm = strata.LLM(tiny, device="cpu", kv_dtype="float32")
    prompt = _tokens(12, seed=2)
    generated = llm.generate(prompt, max_tokens=8, temperature=0).token_ids
    assert len(generated) == 8
    assert llm.logits(prompt + generated[:-1])[len(prompt) - 1 :].argmax(-1).tolist() == generated


def test_a_random_model_stays_finite_through_48_layers(tmp_path):
    path = make_model(tmp_path / "deep.gguf", arch="qwen4exp", preset="tiny", quant="Q8_0", n_layers=48)
    logits = strata.LLM(path, device="cpu", kv_dtype="float32").logits(_tokens(8, seed=3))
    assert logits.isfinite().all() and logits.abs().max() > 0


def test_the_ngram_block_changes_the_logits_and_caches_rows(tiny):
    llm = strata.LLM(tiny, device="cpu", kv_dtype="float32")
    model = llm.engine.model
    ids = _tokens(10, seed=4)
    before = llm.logits(ids)
    assert model.ngram_table.misses > 0
    misses = model.ngram_table.misses
    llm.logits(ids)
    assert model.ngram_table.misses == misses  # the same n-grams come from the row cache
    model.ngram_table.weight.raw = torch.zeros_like(model.ngram_table.weight.raw)
    model.ngram_table.cache.clear()
    assert not torch.allclose(llm.logits(ids), before)


# ---------------------------------------------------------------------------------------------- selection


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="Linux's smaps")
def test_the_ngram_table_is_read_at_random_and_its_missing_rows_asked_for_ahead(tiny):
    """Rows are read at random from the table's shard: its mapping carries MADV_RANDOM (no 32-page readahead a row),
    and a small gather (a decode step's) asks the kernel for the rows it lacks before it touches them."""
    from tests.page_cache import mapping_flags

    model = load_model(GGUFModelFile(tiny), CPU, torch.float32)
    table = model.ngram_table
    raw = table.weight.raw
    assert "rr" in mapping_flags(raw.data_ptr()) and "rr" in mapping_flags(raw.data_ptr() + raw.numel() - 1)
    # The rows a small gather lacks are asked of the kernel first, at their places in the table's shard.
    shard = Path(GGUFModelFile(tiny).tensors["per_layer_token_embd.weight"].file).read_bytes()
    ahead, asked = table.read_ahead, []
    ahead.will_need = lambda rows: asked.extend(int(r) for r in rows)
    table.gather(np.array([[7, 3], [3, 11]], dtype=np.uint64))
    assert sorted(asked) == [3, 7, 11]
    for row in asked:
        start = ahead.offset + row * ahead.row_bytes
        assert shard[start : start + ahead.row_bytes] == raw[row].numpy().tobytes()


def test_indexer_keys_pooled_chunk_by_chunk_equal_one_pass():
    raw = torch.randn(23, 32, dtype=torch.float64)
    k_norm = torch.rand(32) + 0.5
    keys = IndexerKeys(32, CPU, n_rot=16, base=1e7, eps=1e-6)
    for start in range(0, 23, 3):
        keys.append(start, raw[start : start + 3], k_norm)
    assert keys.n_pooled == 5
    assert torch.equal(keys.keys(), pool_block_keys(raw[:20].float(), k_norm, 0, 1e-6, 16, 1e7))


class RecordingKV:
    """Wraps the dense backend: records each selection and attends over the selected cells only (a reference)."""

    def __init__(self, kv):
        self.kv, self.selections = kv, []

    def __getattr__(self, name):
        return getattr(self.kv, name)

    def attend(self, layer, q, k, v, start, selection=None):
        self.selections.append(selection)
        out = self.kv.attend(layer, q, k, v, start)  # stores k, v
        if selection is None:
            return out
        ids, width = selection
        keys, values = self.kv.read(layer, start + q.shape[0], q.dtype)
        rows = []
        for t in range(q.shape[0]):
            cells = ids[t, : width[t]].long()
            kk, vv = keys[cells].repeat_interleave(2, 1), values[cells].repeat_interleave(2, 1)
            w = torch.softmax(torch.einsum("hd,chd->hc", q[t], kk) / q.shape[-1] ** 0.5, -1)
            rows.append(torch.einsum("hc,chd->hd", w, vv))
        return torch.stack(rows)


def test_selection_is_passed_only_past_top_k_plus_3_cells(tmp_path):
    path = make_model(tmp_path / "sel.gguf", arch="qwen4exp", preset="tiny", quant="F32", top_k=8)
    model = load_model(GGUFModelFile(path), CPU, torch.float32)
    cache = model.new_cache(64, torch.float32)
    cache.kv = RecordingKV(cache.kv)
    ids = _tokens(16, seed=5)
    model.forward(torch.tensor(ids[:11]), ForwardContext(cache, 0, 11))
    assert cache.kv.selections == [None]  # 11 cells: every query keeps all of them
    model.forward(torch.tensor(ids[11:]), ForwardContext(cache, 11, 5))
    ids_sel, width = cache.kv.selections[-1]
    assert width.tolist() == [11] * 5 and ids_sel.shape == (5, 11)
    for row in ids_sel:
        assert row.tolist() == sorted(row.tolist()) and row.max() < 16
    assert {12, 13, 14} <= set(ids_sel[3].tolist())  # 15 cells: the unfinished block's cells are always kept


# ---------------------------------------------------------------------------------------------- bad input


def _copy_split(path, dst_dir, metadata=None, drop=(), extra=()):
    """Both shards of `path` copied to dst_dir, the first rewritten with metadata changed and tensors dropped/added."""
    main, table = shard_paths(path)
    new_main, new_table = shard_paths(dst_dir / "bad.gguf")
    shutil.copy(table, new_table)
    model = GGUFModelFile(main)
    main_tensors = {t.name: t for t in model.tensors.values() if t.file == str(main)}
    meta = {k: v for k, v in {**model.metadata, **(metadata or {})}.items() if v is not None}
    specs = [TensorSpec(t.name, t.shape, t.ggml_type, lambda t=t: np.array(t.data))
             for t in main_tensors.values() if t.name not in drop]
    meta["split.tensors.count"] = len(specs) + len(extra) + 1
    write_gguf(new_main, model.architecture, meta, [*specs, *extra])
    return new_main


@pytest.mark.parametrize("metadata, drop, message", [
    # layer 2 holds GatedDeltaNet tensors; an interval of 3 makes it a QSA layer
    ({"qwen4exp.full_attention_interval": 3}, (),
     r"tensor blk\.2\.attn_qkv\.weight does not belong in layer 2, which is a QSA attention layer by "
     r"qwen4exp\.full_attention_interval=3"),
    ({"qwen4exp.ple.head_vocab_sizes": [200] * 16, "qwen4exp.ple.head_offsets": None}, (),
     r"tensor per_layer_token_embd\.weight has shape \[2304, 4\], expected at least \[3200, 4\]"),
    ({"qwen4exp.ple.head_offsets": [0] * 16}, (), "head_offsets is not the running sum of head_vocab_sizes"),
    ({"qwen4exp.ple.layers": [1, 2]}, (), r"qwen4exp\.ple\.layers must name one layer below 4"),
    ({}, ("blk.3.indexer.k_proj.weight",), r"tensor blk\.3\.indexer\.k_proj\.weight is missing"),
])
def test_bad_files_name_the_field_or_tensor(tiny, tmp_path, metadata, drop, message):
    bad = _copy_split(tiny, tmp_path, metadata, drop)
    with pytest.raises(StrataError, match=message) as error:
        strata.LLM(bad, device="cpu")
    assert "\n" not in str(error.value) and "bad" in str(error.value)


def test_a_missing_table_shard_is_one_line(tiny, tmp_path):
    bad = _copy_split(tiny, tmp_path)
    shard_paths(bad)[1].unlink()
    with pytest.raises(StrataError, match=r"split GGUF is missing 1 of 2 shards, first .*bad-00002-of-00002\.gguf"):
        strata.LLM(bad, device="cpu")


def test_a_single_file_without_the_table_names_it(tiny, tmp_path):
    model = GGUFModelFile(tiny)
    meta = {k: v for k, v in model.metadata.items() if not k.startswith("split.")}
    specs = [TensorSpec(t.name, t.shape, t.ggml_type, lambda t=t: np.array(t.data))
             for t in model.tensors.values() if t.name != "per_layer_token_embd.weight"]
    write_gguf(tmp_path / "one.gguf", "qwen4exp", meta, specs)
    with pytest.raises(StrataError, match=r"one\.gguf: tensor per_layer_token_embd\.weight \(the n-gram table, kept "
                                          r"in its own shard\) is missing"):
        strata.LLM(tmp_path / "one.gguf", device="cpu")


@pytest.mark.parametrize("attr, value, message", [
    ("state_shape", (6, 8, 16), r"recurrent state has shape \[6, 8, 16\], the model needs \[6, 16, 16\]"),
    ("ple_history", torch.zeros(9, 128), r"n-gram conv history has shape \[9, 128\], the model needs \[9, 256\]"),
])
def test_a_cache_of_the_wrong_shape_is_refused(tiny, attr, value, message):
    model = load_model(GGUFModelFile(tiny), CPU, torch.float32)
    cache = model.new_cache(32, torch.float32)
    setattr(cache, attr, value)
    with pytest.raises(StrataError, match=message) as error:
        model.forward(torch.tensor([1, 2]), ForwardContext(cache, 0, 2))
    assert "\n" not in str(error.value) and str(tiny) in str(error.value)
    plain = strata.engine.kv.KVCache(1, 2, 32, 32, torch.float32, CPU)
    with pytest.raises(StrataError, match="needs the Qwen4ExpCache of new_cache"):
        model.forward(torch.tensor([1, 2]), ForwardContext(plain, 0, 2))


# ---------------------------------------------------------------------------------------------- MTP


def test_mtp_block_leaves_the_trunk_alone_and_drafts_consistently(tiny, tmp_path):
    path = make_model(tmp_path / "mtp.gguf", arch="qwen4exp", preset="tiny", quant="F32", mtp=True)
    model = load_model(GGUFModelFile(path), CPU, torch.float32)
    assert model.n_main == 4 and model.mtp is not None and 4 in model.expert_stacks
    ids = _tokens(12, seed=6)
    cache = model.new_cache(32, torch.float32)
    residual = model.forward_residual(torch.tensor(ids), ForwardContext(cache, 0, 12))
    trunk = model.head(residual, ForwardContext(cache, 0, 12, want_all_logits=True))
    plain = load_model(GGUFModelFile(tiny), CPU, torch.float32)
    assert torch.equal(trunk, plain.forward(torch.tensor(ids), ForwardContext(plain.new_cache(32, torch.float32), 0,
                                                                               12, want_all_logits=True)))
    # cells 0..10 pair R_i with the token at i+1: all at once, then again one cell at a time over the same cells
    whole, stack = model.mtp_draft(residual[:11], torch.tensor(ids[1:]), cache, 0)
    assert whole.shape == (11, 512) and stack.shape == (11, 4, 64) and whole.isfinite().all()
    steps = torch.cat([model.mtp_draft(residual[i : i + 1], torch.tensor(ids[i + 1 : i + 2]), cache, i)[0]
                       for i in range(11)])
    assert _relative_error(steps, whole) < 1e-4
    with pytest.raises(StrataError, match="has no MTP block"):
        plain.mtp_draft(residual[:1], torch.tensor(ids[1:2]), plain.new_cache(8, torch.float32), 0)


def test_a_restored_checkpoint_continues_as_the_live_cache_does(tiny):
    from strata.engine import checkpoints

    model = load_model(GGUFModelFile(tiny), CPU, torch.float32)
    ids = _tokens(16, seed=7)
    live = model.new_cache(32, torch.float32)
    model.forward(torch.tensor(ids[:13]), ForwardContext(live, 0, 13))
    assert checkpoints.supports(live)
    state, n_bytes = checkpoints.snapshot(live, 13)
    assert n_bytes > 0
    other = model.new_cache(32, torch.float32)
    model.forward(torch.tensor(ids[5:9]), ForwardContext(other, 0, 4))  # holds another sequence first
    checkpoints.restore(other, state)
    assert other.previous_tokens == live.previous_tokens and other.indexer[3].n_pooled == 3
    want = model.forward(torch.tensor(ids[13:]), ForwardContext(live, 13, 3, want_all_logits=True))
    got = model.forward(torch.tensor(ids[13:]), ForwardContext(other, 13, 3, want_all_logits=True))
    assert torch.equal(got, want)
