"""Opening GGUF files: split shards as one model, and one clear line for every kind of bad file."""

import subprocess
import sys

import numpy as np
import pytest
import torch

import strata
from strata.errors import StrataError
from strata.gguf import GGUFModelFile
from strata.gguf.writer import TensorSpec, write_gguf
from strata.models.synthetic import PRESETS, model_metadata, model_tensors


def _write_split(source, stem, n_shards):
    """Write `source`'s tensors into n_shards files the way llama.cpp's gguf-split lays them out."""
    model = GGUFModelFile(source)
    names = list(model.tensors)
    parts = np.array_split(np.arange(len(names)), n_shards)
    paths = []
    for no, part in enumerate(parts):
        meta = dict(model.metadata) if no == 0 else {}
        meta |= {"split.no": no, "split.count": n_shards, "split.tensors.count": len(names)}
        specs = []
        for i in part:
            t = model.tensors[names[i]]
            specs.append(TensorSpec(t.name, t.shape, t.ggml_type, lambda t=t: np.array(t.data)))
        path = source.parent / f"{stem}-{no + 1:05d}-of-{n_shards:05d}.gguf"
        tokenizer = {k: v for k, v in meta.items() if k.startswith("tokenizer.")}
        other = {k: v for k, v in meta.items() if not k.startswith("tokenizer.")}

        def extra(writer, tokenizer=tokenizer):
            from strata.tokenizer_train import write_tokenizer_metadata

            if tokenizer:
                write_tokenizer_metadata(writer, tokenizer)

        write_gguf(path, model.architecture, other, specs, extra=extra)
        paths.append(path)
    return paths


def test_split_model_opens_as_one_and_gives_the_same_logits(tiny_moe, tiny_llm):
    shards = _write_split(tiny_moe, "split-tiny", 3)
    whole, split = GGUFModelFile(tiny_moe), GGUFModelFile(shards[1])  # any shard names the model
    assert split.shards == shards
    assert set(split.tensors) == set(whole.tensors)
    ids = tiny_llm.tokenize("split files are one model")
    assert torch.equal(strata.LLM(shards[0], device="cpu").logits(ids), tiny_llm.logits(ids))


def test_missing_shard_is_named(tiny_moe):
    shards = _write_split(tiny_moe, "gone", 2)
    shards[1].unlink()
    with pytest.raises(StrataError, match="missing 1 of 2 shards.*gone-00002-of-00002.gguf"):
        GGUFModelFile(shards[0])


def test_weights_stay_memory_mapped(tiny_llm):
    """No full-model copy: every quantized matrix is a view of the file's mapping."""
    model = tiny_llm.engine.model
    mapped = tiny_llm.engine.file.tensors["blk.0.ffn_gate_exps.weight"].data
    weights = [model.embed, model.output] + [w for a in model.attention for w in (a.q, a.k, a.v, a.o)]
    weights += [s.gate for s in model.expert_stacks.values()]
    for w in weights:
        storage = w.raw.untyped_storage()
        assert not storage.resizable()  # torch wraps foreign (mapped) memory as a fixed-size storage
    expert = model.expert_stacks[0].gate
    assert np.shares_memory(expert.raw.numpy(), mapped)


def _error_line(path) -> str:
    """Run `strata info` on a file and return stderr, checking the one-line, exit-2, no-traceback contract."""
    result = subprocess.run([sys.executable, "-m", "strata", "info", str(path)], capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("strata: error: "), result.stderr
    return lines[0]


def test_missing_file(tmp_path):
    assert "no such file" in _error_line(tmp_path / "nope.gguf")


def test_not_a_gguf(tmp_path):
    path = tmp_path / "junk.gguf"
    path.write_bytes(b"this is not a model" * 100)
    assert "not a GGUF file" in _error_line(path)


def test_truncated_file_names_the_tensor(tiny_moe, tmp_path):
    path = tmp_path / "cut.gguf"
    data = tiny_moe.read_bytes()
    path.write_bytes(data[: len(data) - 5000])
    line = _error_line(path)
    assert "truncated" in line and "output.weight" in line and str(path) in line


def test_truncated_header(tiny_moe, tmp_path):
    path = tmp_path / "head.gguf"
    path.write_bytes(tiny_moe.read_bytes()[:3000])
    line = _error_line(path)
    assert str(path) in line and ("corrupt" in line or "truncated" in line)


def test_unknown_quant_type(tiny_moe, tmp_path):
    data = bytearray(tiny_moe.read_bytes())
    name = b"blk.0.attn_q.weight"
    at = data.index(name) + len(name)
    n_dims = int.from_bytes(data[at : at + 4], "little")
    type_at = at + 4 + 8 * n_dims
    data[type_at : type_at + 4] = (99).to_bytes(4, "little")
    path = tmp_path / "q99.gguf"
    path.write_bytes(bytes(data))
    line = _error_line(path)
    assert "tensor blk.0.attn_q.weight has unsupported quant type (ggml type id 99)" in line


def _tiny_tensors(arch="qwen3", **changes):
    shape = PRESETS["tiny"]
    specs = model_tensors(arch, shape, "F32", seed=0)
    return [TensorSpec(s.name, changes.get(s.name, s.shape), s.ggml_type,
                       (lambda n=changes.get(s.name): np.zeros(n, np.float32)) if s.name in changes else s.make)
            for s in specs]


def test_unknown_architecture(tmp_path):
    path = tmp_path / "llama.gguf"
    write_gguf(path, "gpt-neox", {"gpt-neox.block_count": 2}, _tiny_tensors())
    assert "unsupported architecture 'gpt-neox'" in _error_line(path)
    from strata.engine.engine import Engine

    with pytest.raises(StrataError, match="unsupported architecture 'gpt-neox'"):  # not its missing tokenizer first
        Engine(path)


def test_wrong_tensor_shape(tmp_path):
    path = tmp_path / "shape.gguf"
    write_gguf(path, "qwen3", model_metadata("qwen3", PRESETS["tiny"], "tiny"), _tiny_tensors(**{"blk.1.attn_k.weight": (16, 64)}))
    with pytest.raises(StrataError, match=r"blk.1.attn_k.weight has shape \[16, 64\], expected \[32, 64\]"):
        from strata.models import load_model

        load_model(GGUFModelFile(path), torch.device("cpu"), torch.float32)


def test_missing_metadata_field(tmp_path):
    path = tmp_path / "nometa.gguf"
    meta = model_metadata("qwen3", PRESETS["tiny"], "tiny")
    del meta["qwen3.attention.head_count"]
    write_gguf(path, "qwen3", meta, _tiny_tensors())
    assert "qwen3.attention.head_count is missing" in _error_line(path)
