"""`strata eval teacher-forced` end to end on the tiny model: each configuration in its own process."""

import json
import os
import subprocess
import sys

import pytest

from strata.errors import StrataError
from strata.eval.teacher_forced import Arm


def run(model, text, a, b, *extra):
    command = [sys.executable, "-m", "strata", "eval", "teacher-forced", str(model), "--text", str(text),
               "--prefix", "40", "--continue", "24", "--greedy", "8", "--device", "cpu", "--a", a, "--b", b, *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # tiny shapes: one thread is fastest
    return subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    from importlib import resources

    path = tmp_path_factory.mktemp("tf") / "text.txt"
    path.write_text(resources.files("strata").joinpath("data/tokenizer_corpus.txt").read_text()[:4000])
    return path


def test_same_configuration_gives_zero_differences_and_a_real_one_does_not(tiny_moe, text):
    same = run(tiny_moe, text, "STRATA_PF_FUSED=0", "STRATA_PF_FUSED=0", "--json")
    assert same.returncode == 0, same.stderr
    result = json.loads(same.stdout)
    for row in ("a_vs_b", "a_vs_a"):
        r = result[row]
        assert r["positions"] == 24 and r["kl"] == 0 and r["argmax_agreement"] == 1 and r["delta_nll"] == 0
        assert r["first_token_kl"] == 0 and r["greedy_match"] is True
        assert r["perplexity_a"] == r["perplexity_b"]

    # KV stored in bfloat16 instead of float32 rounds keys and values: small, non-zero differences.
    differ = run(tiny_moe, text, "kv_dtype=float32", "kv_dtype=bfloat16")
    assert differ.returncode == 0, differ.stderr
    rows = [line for line in differ.stdout.splitlines() if line.startswith("| A vs")]
    assert len(rows) == 2 and "argmax agreement" in differ.stdout and "noise floor" in differ.stdout
    ab = [cell.strip() for cell in rows[0].split("|")]
    aa = [cell.strip() for cell in rows[1].split("|")]
    assert float(ab[4]) > 0 and float(aa[4]) == 0  # KL(A||B) > 0; the A-vs-A floor is exactly 0


def test_bad_configuration_and_short_text_are_one_line_errors(tiny_moe, text, tmp_path):
    with pytest.raises(StrataError, match="neither an environment variable"):
        Arm.parse("not_an_option=1")
    assert Arm.parse("STRATA_PDL=0 OMP_NUM_THREADS=2 kv_dtype=float32") == Arm(
        {"STRATA_PDL": "0", "OMP_NUM_THREADS": "2"}, {"kv_dtype": "float32"})
    with pytest.raises(StrataError, match="STRATA_PDF is not a Strata switch"):  # a typo ran the defaults as B
        Arm.parse("STRATA_PDF=0")
    with pytest.raises(StrataError, match="STRATA_PDL='off' is not a valid int"):
        Arm.parse("STRATA_PDL=off")
    short = tmp_path / "short.txt"
    short.write_text("too short")
    out = run(tiny_moe, short, "", "")
    assert out.returncode == 2 and out.stderr.strip().count("\n") <= 2 and "need prefix" in out.stderr
