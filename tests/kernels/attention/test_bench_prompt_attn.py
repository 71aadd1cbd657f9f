"""The parity tool: its selections follow the recipe, and a tiny run passes every bound."""

import numpy as np

from strata.bench.prompt_attn import main, make_selections


def test_selections_recipe():
    ctx, n_q, cap, recent = 400, 40, 67, 16
    ids, width = make_selections(ctx, n_q, cap, recent, seed=0)
    previous = None
    for i, pos in enumerate(range(ctx - n_q, ctx)):
        w = int(width[i])
        row = ids[i, :w].numpy()
        assert w == min(pos + 1, cap) and (ids[i, w:] == -1).all()
        assert (np.diff(row) > 0).all() and row[-1] == pos and row[0] >= 0
        assert set(range(pos + 1 - recent, pos + 1)) <= set(row.tolist())
        older = set(row[row < pos + 1 - recent].tolist())
        if previous is not None:
            assert 1 <= len(previous - older) <= 3  # about 3% of 51 older cells change per query
        previous = older


def test_identity_below_the_budget():
    ids, width = make_selections(50, 20, 67, 16, seed=0)
    for i, pos in enumerate(range(30, 50)):
        assert ids[i, : int(width[i])].tolist() == list(range(pos + 1))


def test_tiny_run_passes(capsys):
    rc = main(["--ctx", "160", "--queries", "8", "--reps", "1", "--heads", "4", "--kv-heads", "2", "--dim", "64",
               "--top-k", "29", "--recent", "8"])
    text = capsys.readouterr().out
    assert rc == 0, text
    for name in ("fp32", "v1", "v2", "v2t", "imma"):
        assert f"PASS {name}" in text
    assert "sdpa-bf16" in text and "all PASS" in text


def test_tiny_sweep_lists_every_config(capsys, monkeypatch):
    from strata.kernels.attention import prompt_imma, prompt_v2
    from strata.kernels.attention.prompt_blocks import PromptConfig

    for module in (prompt_v2, prompt_imma):  # the labels below read against the plain config
        monkeypatch.setattr(module, "DEFAULT", PromptConfig())
    rc = main(["--ctx", "160", "--queries", "8", "--reps", "1", "--heads", "4", "--kv-heads", "2", "--dim", "64",
               "--top-k", "29", "--recent", "8", "--variants", "v2", "--sweep", "q1h2c16", "q3h1s1", "t1"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "merge q3" in text and "x one selection" in text
    for label in ("default q1h0c32w4s3", "q1h2c16w4s3", "q3h1c32w4s1"):
        assert f"PASS v2    {label}" in text, label
    assert "q1h0c32w4s3t1" in text.split("=bytes")[0].splitlines()[-1]  # t1 reads the same rows: the same bytes
    assert "~bytes" in text.split("q1h2c16w4s3")[1].splitlines()[0]  # other chunks: other sums
    assert "v2 configs by speed-up over its default q1h0c32w4s3" in text and "imma" not in text
    assert "  best v2 " in text and "info probe gathers only      q1h0c32w4s3 " in text
    assert "defaults PASS" in text


def test_tiny_sweep_with_graph_timing_keeps_the_eager_figure(capsys):
    # off the GPU no graph is captured: the eager figure ranks, and is printed beside as on the GPU
    rc = main(["--ctx", "160", "--queries", "8", "--reps", "1", "--heads", "4", "--kv-heads", "2", "--dim", "64",
               "--top-k", "29", "--recent", "8", "--variants", "v2", "--graph", "--sweep", "t1"])
    text = capsys.readouterr().out
    assert rc == 0, text
    line = text.split("PASS v2    q1h0c32w4s3t1")[1].splitlines()[0]
    assert "x default  eager " in line and "vs FP64" in line, line


def test_shape_lists():
    import pytest

    from strata.bench.prompt_attn import LONG_SHAPES, _shapes, parser

    args = parser().parse_args(["--ctx", "1500,2100", "--queries", "1500,256"])
    assert _shapes(args.ctx, args.queries) == [(1500, 1500), (2100, 256)]
    args = parser().parse_args(["--ctx", "160,200", "--queries", "8"])
    assert _shapes(args.ctx, args.queries) == [(160, 8), (200, 8)]
    assert parser().parse_args(["--long"]).long and LONG_SHAPES == [(131072, 512), (524288, 256)]
    with pytest.raises(SystemExit):
        _shapes([1, 2, 3], [4, 5])


def test_programs_per_sm():
    from strata.bench.prompt_attn_sweep import programs_per_sm

    assert programs_per_sm(168, 25 * 1024, 4) == 3  # the upstream imma kernel: 168 registers, 25.5 KB, 3 a SM
    assert programs_per_sm(128, 50 * 1024, 4) == 4 and programs_per_sm(255, 0, 4) == 2
    assert programs_per_sm(64, 120 * 1024, 4) == 1 and programs_per_sm(32, 0, 8) == 8  # smem, then threads bind


def test_sass_lines_from_an_offline_compile(capfd):
    # the kernels compiled for sm_90 here (a child process with the interpreter off), no GPU: registers, spills,
    # shared memory and the chunk loop's instructions
    import os

    import pytest
    import triton

    from strata.bench.prompt_attn_sass import loop_opcodes

    sass = ["        /*0010*/   IMAD R1, R2, R3, RZ ;", "        /*0020*/   @!P0 LDS R4, [R5] ;",
            "        /*0030*/   BRA 0x10 ;", "        /*0040*/   EXIT ;"]
    assert loop_opcodes(sass) == {"IMAD": 1, "LDS": 1, "BRA": 1}
    if not os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")):
        pytest.skip("no ptxas in this Triton")
    assert main(["--sass", "t2r128x1", "--variants", "v2"]) == 0
    text = capfd.readouterr().out
    for label in ("v2    q1h0c32w4s3t2r168x1 ", "v2    q1h0c32w4s3t2r128x1 "):  # the default first
        line = text.split(label)[1].splitlines()[0]
        assert "regs" in line and "B spilled" in line and "/SM; loop" in line and "HMMA" in line, line
