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


@pytest.mark.skipif(not PTXAS.exists(), reason="this Triton build carries no ptxas")
def test_register_operand_kernels_keep_an_operand_out_of_shared_memory():
    # "a" and "r" (fused_q2_0_regs): the rows' values reach the wgmma from registers, so a kernel's only shared-memory
    # buffer is its decoded weights'; "t": the weights do, and the only buffer is the ring x is copied through; an
    # "h" kernel has both. Nothing spills. (One process: t and a, a and t, r at 8 warps, then "h".)
    shapes = ["128x64x8x3ht/64x4x3ha", "128x32x4x3ha/64x4x3ht", "128x64x8x3hr/128x128x8x3hr", "128x32x4x3h/64x4x3h"]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    run = subprocess.run([sys.executable, str(Path(__file__).with_name("sm90_build.py")), "--fused-shapes", *shapes],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    builds = [json.loads(line) for line in run.stdout.splitlines()]
    assert [b["allocs"] for b in builds] == [1, 1, 1, 1, 1, 1, 2, 2], builds
    assert not any(b["stack"] for b in builds), builds
