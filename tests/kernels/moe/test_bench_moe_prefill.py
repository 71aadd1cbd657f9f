import pytest
import torch

from strata.bench.moe_prefill import FUSED_SWEEP, main, make_layer, parse_args
from strata.errors import StrataError
from strata.kernels.moe.stack import Tiles


def test_parity_tool_runs_and_passes_at_a_tiny_shape(capsys):
    code = main(["--only", "Q2_0 / Q2_0", "--tokens", "32,48", "--experts", "16", "--embd", "64", "--ff", "64",
                 "--reps", "1", "--device", "cpu"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "fused vs mmq: rel RMS" in out and "FAIL" not in out and out.count("Q2_0 / Q2_0,") == 2
    assert "measured matrix rates: int8" in out and "x floor" in out and "x best" in out
    assert "at the best int8 rate" in out and "int8 at 8192^3 (the best int8 rate)" in out


def test_layer_recipe():
    layer = make_layer("IQ4_XS / IQ4_NL", 100, n_experts=32, n_embd=256, n_ff=64)
    assert (layer.x[77] == 0).all() and layer.topk_ids.shape == (100, 10)
    counts = torch.bincount(layer.topk_ids.flatten().long(), minlength=32)
    assert counts[0] == counts[1] == 100 and counts[28:].sum() == 0
    assert (layer.topk_ids.sort(dim=1).values.diff(dim=1) > 0).all()  # distinct experts per token
    assert torch.allclose(layer.topk_weights.sum(1), torch.ones(100))
    assert layer.experts.down.rows == 256 and layer.experts.gate.rows == 64


def test_default_arguments_are_the_full_layer():
    args = parse_args([])
    assert (args.embd, args.ff, args.experts, args.top_k, args.tokens) == (2560, 640, 512, 10, [2048])
    assert len(args.pairs) == 6 and args.paths == ["dense", "mmq", "fused"]


def test_sweep_times_each_shape_beside_the_default(capsys):
    code = main(["--only", "Q2_0 / Q2_0", "--tokens", "16", "--experts", "16", "--embd", "64", "--ff", "64",
                 "--reps", "1", "--device", "cpu", "--paths", "mmq,fused", "--sweep", "64x8x2,128x64x4x1"])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = [line.split()[:2] for line in out.splitlines() if line.startswith("  mmq") or line.startswith("  fused")]
    assert rows == [[path, shape] for path in ("mmq", "fused") for shape in ("default", "64x8x2", "128x64x4x1")]
    assert "DIFFERENT" not in out


def test_sweep_shapes_are_checked():
    with pytest.raises(StrataError, match="BNxWARPSxSTAGES"):
        parse_args(["--sweep", "128x8"])
    with pytest.raises(StrataError, match="power of two"):
        parse_args(["--sweep", "96x8x2"])
    assert parse_args(["--sweep"]).sweep == "default"  # each path's own list (FUSED_SWEEP for fused)
    assert parse_args(["--sweep", "128x64x8x2"]).sweep[0] == Tiles(64, 8, 2, rows=128)
    fused = parse_args(["--sweep", "128x32x8x3/64x4x2"]).sweep[0]
    assert fused == Tiles(32, 8, 3, rows=128, down=Tiles(64, 4, 2, rows=128)) and str(fused) == "128x32x8x3/64x4x2"
    split = parse_args(["--sweep", "32x8x3s/64x8x3s"]).sweep[0]
    assert split.split and split.down.split and str(split) == "32x8x3s/64x8x3s"
    with pytest.raises(StrataError, match="rows"):
        parse_args(["--sweep", "128x32x8x3/64x64x4x2"])
    assert all(Tiles.parse(t).bn % 32 == 0 for t in FUSED_SWEEP)  # H is rounded per 32 features of a program


def test_sweep_checks_the_fp16_shapes_against_the_bounds_not_the_bytes(capsys):
    code = main(["--only", "Q2_0 / Q2_0", "--tokens", "16", "--experts", "16", "--embd", "64", "--ff", "64",
                 "--reps", "1", "--device", "cpu", "--paths", "fused", "--sweep", "32x4x2h/64x4x2h,32x4x2m/64x4x2m"])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.splitlines()
    h = next(i for i, line in enumerate(lines) if line.startswith("  fused  32x4x2h/64x4x2h "))
    assert lines[h + 1].startswith("    vs rounded rms") and "zero token 0" in lines[h + 1]  # its bounds
    assert out.count("vs rounded rms") == 1  # the "m" shape is held to the default's bytes instead
    assert out.count("[gate-up ") == 3  # the default and both shapes: the two kernels timed alone
    assert "DIFFERENT" not in out and "OUT OF BOUNDS" not in out
