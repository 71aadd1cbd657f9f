"""`strata bench qsa-attn` at a tiny size: both paths timed, the kernel within its bound, every sweep config a row."""

import torch

from strata.bench.qsa_attn import floor_bytes, main
from strata.kernels.attention.prompt_dense import DEFAULT


def test_tiny_run_with_sweep_passes(capsys):
    rc = main(["--ctx", "64", "--tokens", "8", "--heads", "4", "--kv-heads", "2", "--dim", "32", "--top-k", "13",
               "--recent", "4", "--reps", "1", "--sweep", "q1c32w4s3", "q2h0c16w4s1"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "info dense-mask SDPA (old)" in text and f"PASS kernel {DEFAULT.label}" in text and "all PASS" in text
    assert text.count("PASS sweep") == 3 and "q2h0c16w4s1" in text and "PASS decode step" in text


def test_floor_counts_cells_heads_and_io():
    width = torch.tensor([3, 5])
    assert floor_bytes(width, 2, 4, 32) == 8 * (2 * 2 * 32 * 2 + 4) + 2 * 2 * 4 * 32 * 4


def test_sass_lines_from_an_offline_compile(capfd):
    """The kernel compiled for sm_90 here (a child process with the interpreter off), no GPU: the default, the decode
    config, then the one asked, each with registers, spills, shared memory and the chunk loop's dots."""
    import os

    import pytest
    import triton

    if not os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")):
        pytest.skip("no ptxas in this Triton")
    assert main(["--sass", "q1c16w4s1", "--heads", "4", "--kv-heads", "2", "--dim", "64"]) == 0
    lines = [line for line in capfd.readouterr().out.splitlines() if "regs" in line]
    from strata.kernels.attention.prompt_dense import ROW_EXACT

    assert [line.split()[0] for line in lines] == [DEFAULT.label, ROW_EXACT.label, "q1h0c16w4s1"]
    assert all("B spilled" in line and "/SM; loop" in line and "HMMA" in line for line in lines), lines
