"""`strata make-model --arch qwen4exp`: the full preset's shapes and bytes (counted, not written), the table written
as a hole, the 2-shard layout through the CLI, and the qwen3next full preset."""

import errno
import subprocess
import sys

import numpy as np
import pytest

import strata.gguf.reader as reader
from strata.errors import StrataError
from strata.gguf.reader import GGUFModelFile
from strata.gguf.writer import TensorSpec, write_gguf
from strata.models.ngram_embedding import MULTIPLIERS, NgramHash
from strata.models.synthetic import FULL_PRESETS, make_model, model_tensors, qwen3next_shape
from strata.models.synthetic_qwen4exp import PRESETS, main_tensors, metadata, table_tensor

EXPERT_BYTES = 1_382_400  # one Q2_0 expert: gate and up 640 x 2560, down 2560 x 640, 18 bytes per 64 weights


def test_full_preset_has_strata_shapes_and_24576_q2_0_experts():
    s = PRESETS["full"]
    specs = {t.name: t for t in main_tensors(s, "Q8_0", 0)}
    experts = [t for t in specs.values() if "_exps." in t.name]
    assert len(experts) == 48 * 3 and {t.ggml_type for t in experts} == {42}
    assert sum(t.n_bytes for t in experts) == 24_576 * EXPERT_BYTES
    assert specs["blk.0.ffn_gate_exps.weight"].shape == (512, 640, 2560)
    qsa = sorted(int(n.split(".")[1]) for n in specs if n.endswith("indexer.k_proj.weight"))
    assert qsa == list(range(3, 48, 4))  # 12 QSA layers, l % 4 == 3; the other 36 are GDN
    assert sum(n.endswith("attn_qkv.weight") for n in specs) == 36
    assert specs["blk.0.attn_qkv.weight"].shape == (10240, 2560) and specs["blk.3.attn_q.weight"].shape == (12288, 2560)
    assert specs["blk.0.hc_attn_down.weight"].shape == (320, 10240) and specs["blk.1.ple_key.weight"].shape == (10240, 2560)
    table = table_tensor(s, 0)
    assert table.shape == (320_001_536, 160) and table.make is None and table.n_bytes == 28_800_138_240
    meta = metadata(s, "full")
    assert meta["qwen4exp.attention.indexer.top_k"] == 2048 and meta["qwen4exp.ple.head_offsets"][-1] == 300_001_275


def test_qwen3next_full_preset_is_80b_a3b():
    specs = model_tensors("qwen3next", qwen3next_shape(FULL_PRESETS["qwen3next"]), "Q8_0", 0)
    names = {t.name: t for t in specs}
    assert names["blk.0.ffn_gate_exps.weight"].shape == (512, 512, 2048)
    assert sum(n.endswith("attn_q.weight") for n in names) == 12 and names["blk.3.attn_q.weight"].shape == (8192, 2048)
    assert names["blk.0.attn_qkv.weight"].shape == ((2 * 16 + 32) * 128, 2048)


def test_a_zero_tensor_is_written_as_a_hole_that_reads_as_zeros(tmp_path):
    data = np.arange(64, dtype=np.float32)
    specs = [TensorSpec("a", (64,), 0, lambda: data), TensorSpec("z", (1 << 20,), 0, None),
             TensorSpec("b", (64,), 0, lambda: data + 1)]
    write_gguf(tmp_path / "holes.gguf", "qwen3", {}, specs)
    model = GGUFModelFile(tmp_path / "holes.gguf")
    assert np.array_equal(model.tensor("a").data.view(np.float32), data)
    assert np.array_equal(model.tensor("b").data.view(np.float32), data + 1)
    zeros = model.tensor("z").data
    assert zeros.size == 4 << 20 and not zeros.any()


def test_a_shard_too_large_for_a_private_mapping_is_mapped_read_only(tmp_path, monkeypatch):
    write_gguf(tmp_path / "m.gguf", "qwen3", {}, [TensorSpec("a", (32,), 0, lambda: np.ones(32, np.float32))])
    modes = []

    class Refusing(reader._CheckedReader):
        def __init__(self, path, mode="c"):
            modes.append(mode)
            if mode == "c":
                raise OSError(errno.ENOMEM, "Cannot allocate memory")
            super().__init__(path, mode)

    monkeypatch.setattr(reader, "_CheckedReader", Refusing)
    model = GGUFModelFile(tmp_path / "m.gguf")
    assert modes == ["c", "r"] and model.tensor("a").data.view(np.float32).sum() == 32


def test_cli_writes_two_shards_and_info_counts_the_experts(tmp_path):
    def strata(*args):
        return subprocess.run([sys.executable, "-m", "strata", *map(str, args)], capture_output=True, text=True)

    made = strata("make-model", "--arch", "qwen4exp", "--preset", "tiny", "-o", tmp_path / "q4.gguf")
    assert made.returncode == 0, made.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q4-00001-of-00002.gguf", "q4-00002-of-00002.gguf"]
    info = strata("info", tmp_path / "q4-00001-of-00002.gguf")
    assert info.returncode == 0, info.stderr
    assert "qwen4exp: 4 layers, hidden 64" in info.stdout and "(2 files" in info.stdout
    assert "32 experts in 4 layers, 3,456 bytes each (110,592 bytes)" in info.stdout


def test_tiny_metadata_reads_back_with_64_bit_hash_constants(tmp_path):
    path = make_model(tmp_path / "t.gguf", arch="qwen4exp", preset="tiny", quant="Q8_0")
    hash_ = NgramHash.from_gguf(GGUFModelFile(path), "qwen4exp")
    assert hash_.multipliers == MULTIPLIERS and hash_.vocab_sizes == PRESETS["tiny"].head_vocab_sizes
    with pytest.raises(StrataError, match="--arch qwen4exp has presets tiny, full, not small"):
        make_model(tmp_path / "x.gguf", arch="qwen4exp", preset="small")


def test_the_ngram_table_is_not_counted_as_device_weights(tmp_path):
    import torch

    from strata.engine.placement import expert_tensor_bytes, plan_placement
    from strata.models import config_of

    model = GGUFModelFile(make_model(tmp_path / "p.gguf", arch="qwen4exp", preset="tiny", quant="Q8_0"))
    plan = plan_placement(model, config_of(model), torch.device("cpu"), 64, 2, vram_budget_gib=1)
    table = model.tensor("per_layer_token_embd.weight").n_bytes
    assert plan.dense_bytes == model.n_bytes - expert_tensor_bytes(model)[0] - table
