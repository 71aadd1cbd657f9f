"""tools/train_small.py at a tiny size on the CPU: text cleaning, the .deb reader, the MTP head, and the whole
pipeline (prepare -> train a few steps -> export -> our engine agrees with transformers -> ship)."""

from __future__ import annotations

import io
import json
import lzma
import math
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from strata import default_model  # noqa: E402
from tools import train_data, train_small  # noqa: E402
from tools.train_mtp import Qwen3NextMTP  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def test_rst_keeps_prose_and_drops_code_markup_and_headings():
    source = """\
.. _tut-if:

:keyword:`!if` Statements
=========================

Perhaps the most well-known statement is :keyword:`if`, see :func:`~os.path.join` and
:ref:`the guide <tut-guide>`.  For example::

   >>> x = int(input("Please enter an integer: "))

.. function:: abs(x)

   Return the *absolute* value of ``x``.

.. index:: statement: for

.. code-block:: python

   print("never")

Last words.
"""
    prose = train_data.rst_to_prose(source)
    assert prose.split("\n\n") == [
        "if Statements",
        "Perhaps the most well-known statement is if, see join and the guide. For example:",
        "abs(x)",
        "Return the absolute value of x.",
        "Last words.",
    ]


def test_html_keeps_paragraphs_and_drops_listings_and_tables():
    source = ("<html><body><h1>Title</h1><p>A <b>table</b> is\n  a set of rows.</p><pre>SELECT 1;</pre>"
              "<table><tr><td><p>cell</p></td></tr></table><p>Done.</p><p>123</p></body></html>")
    assert train_data.html_to_prose(source) == "A table is a set of rows.\n\nDone."


def _deb(files: dict[str, bytes]) -> bytes:
    """A minimal Debian package: an ar archive of debian-binary, control.tar.xz and data.tar.xz."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as archive:
        for name, content in files.items():
            info = tarfile.TarInfo(f"./{name}")
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    members = [("debian-binary", b"2.0\n"), ("control.tar.xz", lzma.compress(b"")),
               ("data.tar.xz", lzma.compress(data.getvalue()))]
    out = b"!<arch>\n"
    for name, content in members:
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(content):<10}`\n".encode() + content
        out += b"\n" * (len(content) & 1)
    return out


def test_deb_members_reads_the_data_archive(tmp_path):
    path = tmp_path / "x.deb"
    path.write_bytes(_deb({"usr/share/doc/a.rst.txt": b"Hello.", "usr/share/doc/b.html": b"<p>odd</p>"}))
    members = train_data._deb_members(path)
    assert members == {"usr/share/doc/a.rst.txt": b"Hello.", "usr/share/doc/b.html": b"<p>odd</p>"}
    (tmp_path / "y.deb").write_bytes(b"not an archive")
    with pytest.raises(ValueError, match="not a Debian package"):
        train_data._deb_members(tmp_path / "y.deb")


def test_held_out_documents_are_disjoint_and_fixed():
    documents = {f"doc{i:03d}": f"text {i}" for i in range(100)} | {"empty": ""}
    train, held = train_data.split_documents(documents)
    assert held == ["doc020", "doc060"] and not set(train) & set(held) and "empty" not in train


def test_mtp_head_is_causal_and_round_trips_under_checkpoint_names():
    torch.manual_seed(0)
    config = train_small.make_config(train_small.TINY, vocab_size=64, seq_len=32)
    from transformers import Qwen3NextForCausalLM

    model = Qwen3NextForCausalLM(config).eval()
    head = Qwen3NextMTP.for_model(model).eval()
    final_hidden = train_small.FinalHidden(model)
    ids = torch.randint(0, 64, (1, 12))
    changed = ids.clone()
    changed[0, 8] = (ids[0, 8] + 1) % 64
    with torch.no_grad():
        model(input_ids=ids)
        before = head(model, final_hidden.value[:, :-1], ids[:, 1:])
        model(input_ids=changed)
        after = head(model, final_hidden.value[:, :-1], changed[:, 1:])
    # Position t reads x_{t+1}: changing x_8 leaves positions 0..6 alone and changes position 7.
    assert torch.allclose(before[0, :7], after[0, :7], atol=1e-5)
    assert not torch.allclose(before[0, 7], after[0, 7], atol=1e-3)

    tensors = head.checkpoint_tensors()
    assert {"mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight",
            "mtp.layers.0.self_attn.q_proj.weight", "mtp.layers.0.mlp.experts.7.down_proj.weight",
            "mtp.layers.0.mlp.shared_expert_gate.weight"} <= set(tensors)
    assert tensors["mtp.fc.weight"].shape == (config.hidden_size, 2 * config.hidden_size)
    copy = Qwen3NextMTP(config)
    copy.load_checkpoint_tensors(tensors)
    assert all(torch.equal(a, b) for a, b in zip(head.state_dict().values(), copy.state_dict().values()))


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """prepare on README paragraphs, then a few training steps of the tiny preset."""
    root = tmp_path_factory.mktemp("train")
    paragraphs = [p for p in (REPO / "README.md").read_text().split("\n\n") if p.strip()]
    texts = root / "texts"
    texts.mkdir()
    for index in range(30):
        (texts / f"doc{index:02d}.txt").write_text("\n\n".join(paragraphs[index % len(paragraphs):][:3]))
    train_small.main(["prepare", "--text", str(texts), "--out", str(root / "data"), "--vocab", "384"])
    train_small.main(["train", "--data", str(root / "data"), "--out", str(root / "run"), "--preset", "tiny",
                      "--max-steps", "3", "--batch", "2", "--seq-len", "32", "--eval-windows", "2",
                      "--report-windows", "3", "--sample-tokens", "4", "--warmup", "1"])
    return root


def test_prepare_writes_tokens_tokenizer_and_a_manifest_of_hashes(tiny_run):
    data = tiny_run / "data"
    manifest = json.loads((data / "manifest.json").read_text())
    assert manifest["heldout_documents"] == ["doc20.txt"] and manifest["vocab_size"] == 384
    for name, digest in manifest["files"].items():
        assert train_data.sha256_file(data / name) == digest
    ids = np.fromfile(data / "train.bin", dtype=np.uint16)
    assert ids.size == manifest["train_tokens"] and ids.max() < 384
    assert len(json.loads((data / "tokenizer_gguf.json").read_text())["tokenizer.ggml.tokens"]) == 384


def test_training_writes_checkpoint_log_and_a_gguf_our_engine_agrees_with(tiny_run):
    import strata
    from safetensors import safe_open

    run = tiny_run / "run"
    result = json.loads((run / "result.json").read_text())
    assert result["training"]["steps"] == 3 and result["gguf"]["bytes"] == (run / "model.gguf").stat().st_size
    events = [json.loads(line)["event"] for line in (run / "train_log.jsonl").read_text().splitlines()]
    assert events[0] == "start" and events[-1] == "eval"
    with safe_open(run / "checkpoint" / "model.safetensors", "pt") as weights:
        names = set(weights.keys())
    assert "mtp.fc.weight" in names and "model.layers.0.linear_attn.in_proj_qkvz.weight" in names

    llm = strata.LLM(run / "model.gguf", device="cpu", dtype="float32", kv_dtype="float32")
    assert len(llm.engine.model.mtp) == 1  # the trained MTP head ships in the GGUF (blk.N.nextn.*), for --spec
    record = result["heldout_transformers"]
    windows = default_model.read_windows(run / "heldout_eval.bin", record["window_tokens"])
    assert windows.shape == (3, 32)
    ours = math.exp(default_model.heldout_nll(llm, windows))
    assert abs(ours / record["perplexity"] - 1) <= 0.01  # Q8_0 against float32 transformers


def test_ship_installs_the_file_the_default_model_checks_read(tiny_run, monkeypatch):
    dest, pins, bench = tiny_run / "shipped", tiny_run / "pins.json", tiny_run / "BENCHMARKS.md"
    from tools.train_report import BENCH_BEGIN, BENCH_END

    # A previous ship's section is replaced, the rest of the file kept.
    bench.write_text(f"# Benchmarks\n\nolder section\n\n{BENCH_BEGIN}\nstale\n{BENCH_END}\n\nlater section\n")
    train_small.main(["ship", "--run", str(tiny_run / "run"), "--dest", str(dest), "--pins", str(pins),
                      "--pin-tokens", "2", "--benchmarks", str(bench)])
    text = bench.read_text()
    assert text.startswith("# Benchmarks\n\nolder section\n") and text.endswith("\n\nlater section\n")
    assert text.count(BENCH_BEGIN) == 1 and "stale" not in text
    assert "Strata, CPU float32, the shipped Q8_0 GGUF" in text
    monkeypatch.setattr(default_model, "SHIPPED_DIR", dest)
    manifest = default_model.read_manifest()
    assert default_model.sha256_of(default_model.shipped_path()) == manifest["sha256"]
    assert default_model.resolve_model(None, notice=pytest.fail) == str(dest / default_model.SHIPPED_GGUF)
    assert set(json.loads(pins.read_text())) == set(default_model.SAMPLE_PROMPTS)


def test_adding_the_mtp_block_later_gives_the_tensors_of_exporting_it_at_once(tiny_run, tmp_path):
    import gguf
    from transformers import Qwen3NextForCausalLM

    from tools import export_hf
    from tools.add_mtp_block import add_mtp_block

    run = tiny_run / "run"
    assert json.loads((run / "result.json").read_text())["gguf"]["mtp_block"]  # the exporter wrote it at once
    metadata = json.loads((tiny_run / "data" / "tokenizer_gguf.json").read_text())
    model = Qwen3NextForCausalLM.from_pretrained(run / "checkpoint").float().eval()  # drops mtp.*
    export_hf.export_gguf(model, tmp_path / "main.gguf", "Q8_0", tokenizer_metadata=metadata)
    assert add_mtp_block(tmp_path / "main.gguf", run / "checkpoint", tmp_path / "added.gguf") > 0

    def tensors(path):
        return {t.name: (int(t.tensor_type), bytes(np.asarray(t.data).tobytes())) for t in gguf.GGUFReader(path).tensors}

    assert tensors(tmp_path / "added.gguf") == tensors(run / "model.gguf")
    fields = gguf.GGUFReader(tmp_path / "added.gguf").fields
    assert fields["qwen3next.block_count"].contents() == 5 and fields["qwen3next.nextn_predict_layers"].contents() == 1
    with pytest.raises(SystemExit, match="already an MTP block"):
        add_mtp_block(run / "model.gguf", run / "checkpoint", tmp_path / "twice.gguf")
