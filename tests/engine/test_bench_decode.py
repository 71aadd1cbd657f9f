"""`strata bench decode` on a tiny offloaded model: the step figures (mean, median, worst, adapting steps) and the
issue's floor, whose GPU part is the same model's all-resident step where that fits."""

import re

from strata.cli import main


def test_bench_decode_prints_the_steps_and_the_floor_from_the_resident_step(tiny_moe, capsys):
    args = ["bench", "decode", str(tiny_moe), "--device", "cpu", "--expert-cache", "4", "--misses", "direct",
            "--tokens", "4", "--prompt-tokens", "8"]
    assert main(args) in (0, None)
    out = capsys.readouterr().out
    assert re.search(r"steps +median [\d.]+ ms = [\d.]+ tok/s; worst [\d.]+ ms \(step \d", out), out
    adapting = re.search(r"adapting +(\d+) of 4 steps adapted the cache \((\d+) swaps", out)
    assert adapting and int(adapting[1]) == 1, out  # every 4th step's counts, taken in a step later
    resident = r"GPU step +[\d.]+ ms: the same model with every expert resident, the median device time"
    assert re.search(resident, out), out
    assert "(GPU time per token (all-resident step))" in out or "miss bytes" in out.split("floor")[-1], out
    assert main(args + ["--gpu-floor", "2.5", "--adapt-sweep", "1x2"]) in (0, None)
    out = capsys.readouterr().out
    assert "GPU step   2.50 ms: given" in out and re.search(r"floor +[\d.]+ ms/token", out), out
    rows = re.findall(r"^  (\S+)(?: \(default\))? +[\d.]+ tok/s \(([\d.]+)x\)", out, re.M)
    assert [name for name, _ in rows] == ["4x96", "1x2"] and rows[0][1] == "1.00", out


def test_bench_decode_refuses_bad_floor_and_sweep_values(tiny_moe, capsys):
    assert main(["bench", "decode", str(tiny_moe), "--device", "cpu", "--gpu-floor", "fast"]) == 2
    assert "--gpu-floor must be resident, bytes or a positive number of ms, got 'fast'" in capsys.readouterr().err
    assert main(["bench", "decode", str(tiny_moe), "--device", "cpu", "--adapt-sweep", "4x96,often"]) == 2
    assert "--adapt-sweep takes EVERYxSWAPS pairs such as 4x96,2x48, got 'often'" in capsys.readouterr().err
