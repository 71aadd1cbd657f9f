"""`strata bench prompt` on a tiny model: tokens/s per context beside the floors of its placement."""

import re

from strata import switches
from strata.cli import main


def test_bench_prompt_streamed_and_resident(tiny_moe, capsys):
    args = ["bench", "prompt", str(tiny_moe), "--device", "cpu", "--ctx", "20,36", "--prefill", "auto:16"]
    assert main(args + ["--expert-cache", "10", "--prefill-stream", "on"]) in (0, None)
    out = capsys.readouterr().out
    assert len(re.findall(r"ctx +(20|36): +[\d.]+ tok/s \([\d.]+ s to the last logits, \d chunks; the device idle "
                          r"-?[\d.]+ ms later: [\d.]+ tok/s\)", out)) == 2, out
    chunks = [int(n) for n in re.findall(r"GB streamed in (\d+) chunks", out)]
    assert chunks == [2, 3], out  # the equal chunks of up to 16 tokens
    assert len(re.findall(r"streaming host [\d.]+ ms a routed layer", out)) == 2, out
    lent = re.findall(r"lent slots   ([\d.]+) ms a prompt on the host lending them at its start, ([\d.]+) ms", out)
    assert len(lent) == 2 and all(float(a) > 0 and float(b) > 0 for a, b in lent), out
    # the default form, the copy engines (on the CPU torch runs their plan); a ring of one layer queues after
    assert len(re.findall(r"STRATA_PF_STREAM=dma: \d+ copy calls a routed layer by torch, next layer queued "
                          r"after the launch\n", out)) == 2, out
    with switches.override(STRATA_PF_STREAM="gather"):
        assert main(args + ["--ctx", "20", "--expert-cache", "10", "--prefill-stream", "on"]) in (0, None)
    out = capsys.readouterr().out
    assert "streamed by  STRATA_PF_STREAM=gather, next layer queued after the launch\n" in out, out
    assert main(args + ["--ctx", "20"]) in (0, None)
    out = capsys.readouterr().out
    assert "all resident" in out and "read floor" in out and "PCIe" not in out.split("ctx ")[-1], out


def test_bench_prompt_refuses_a_bad_context_list(tiny_moe, capsys):
    assert main(["bench", "prompt", str(tiny_moe), "--device", "cpu", "--ctx", "many"]) == 2
    assert "--ctx must be comma-separated token counts" in capsys.readouterr().err


def test_bench_prompt_says_how_long_qwen4exps_forwards_waited_for_ngram_rows(tmp_path, capsys):
    """qwen4exp gathers a chunk's n-gram rows on a host thread: the bench prints the forwards' wait for them (on a
    cold page cache under the table's shard the GPU waits for those rows), each run's time in order, and the
    checkpoint its hybrid cache gets at each prompt's end (every timed prompt is new: each saves one)."""
    from strata.models.synthetic import make_model

    path = make_model(tmp_path / "tiny.gguf", arch="qwen4exp", preset="tiny", quant="F32")
    args = ["bench", "prompt", str(path), "--device", "cpu", "--ctx", "40", "--prefill", "auto:16", "--reps", "2"]
    assert main(args) in (0, None)
    out = capsys.readouterr().out
    assert re.search(r"ctx +40: .*\n  each run     [\d.]+, [\d.]+ s to the last logits, in order\n", out), out
    assert re.search(r"ctx +40: .*\n(.*\n)*  n-gram rows  the forwards waited [\d.]+ ms a prompt", out), out
    saved = re.search(r"  checkpoint   [\d.]+ ms a prompt on the host, ([\d.]+) MB copied to host RAM", out)
    assert saved and float(saved.group(1)) > 0, out
