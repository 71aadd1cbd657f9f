"""The kernels build for Hopper (sm_90) with their launch configurations, and none spills registers to the stack."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton

ROOT = Path(__file__).resolve().parents[3]
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


@pytest.mark.skipif(not PTXAS.exists(), reason="this Triton build carries no ptxas")
def test_kernels_build_for_sm90_without_spills():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    formats = ["helpers", "Q2_0", "IQ2_XS", "Q4_K", "IQ3_S", "IQ4_NL"]
    run = subprocess.run([sys.executable, str(Path(__file__).with_name("sm90_build.py")), *formats], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    builds = [json.loads(line) for line in run.stdout.splitlines()]
    assert len(builds) == 6 + 4 * 5 - 3 + 1  # the 256-weight formats build no down projection; Q2_0 a fused down
    spilled = [b for b in builds if b["stack"]]
    assert not spilled, spilled
