"""`strata bench decode --pdl-sweep`: one row per STRATA_PDL mode beside the first run, on the loaded engine (on the
CPU the modes change nothing: the plumbing and the rows), and a bad mode refused in one line."""

import re

from strata import switches
from strata.cli import main


def test_pdl_sweep_prints_a_row_per_mode_and_restores_the_switch(tiny_moe, capsys):
    args = ["bench", "decode", str(tiny_moe), "--device", "cpu", "--tokens", "3", "--prompt-tokens", "6",
            "--pdl-sweep", "1,3"]
    assert main(args) in (0, None)
    out = capsys.readouterr().out
    rows = re.findall(r"^  (\d)(?: \(above\))? +[\d.]+ tok/s \(([\d.]+)x\) +[\d.]+ +[\d.]+$", out, re.M)
    default = str(switches.get("STRATA_PDL"))  # the first row: the run above, under the process's mode
    assert [mode for mode, _ in rows] == [default, "1", "3"] and rows[0][1] == "1.000", out
    assert switches.get("STRATA_PDL") == int(default)


def test_pdl_sweep_refuses_a_mode_that_does_not_exist(tiny_moe, capsys):
    assert main(["bench", "decode", str(tiny_moe), "--device", "cpu", "--pdl-sweep", "1,7"]) == 2
    assert "--pdl-sweep takes STRATA_PDL modes (0, 1, 2, 3), got '7'" in capsys.readouterr().err
