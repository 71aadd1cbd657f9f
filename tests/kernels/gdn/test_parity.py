"""The device parity tool runs end to end at a tiny size (on CPU: the torch forms only) and passes its bounds."""

from strata.kernels.gdn.parity import main


def test_tiny_run_passes(capsys):
    rows = main(["--tokens", "70", "--k-heads", "2", "--v-heads", "4", "--dim", "16", "--dtype", "float32",
                 "--device", "cpu", "--reps", "1"])
    assert [r["form"] for r in rows] == ["torch chunked (prompt)", "torch recurrent (prompt)",
                                         "torch recurrent (decode 1 token)"]
    assert all(r["ok"] and r["out"] < 1e-5 for r in rows)
    assert "PASS" in capsys.readouterr().out
