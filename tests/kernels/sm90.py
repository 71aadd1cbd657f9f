"""Kernels built for sm_90 without a GPU (Triton's bundled ptxas): a test file run as a script (its `__main__`
block, the interpreter off) builds them and prints one JSON line a build; its test reads them back."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton

ROOT = Path(__file__).resolve().parents[2]
needs_ptxas = pytest.mark.skipif(not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists(),
                                 reason="this Triton build carries no ptxas")


def builds_of(test_file: str, timeout: int = 300) -> list[dict]:
    """The JSON lines `test_file` prints when run as a script, the interpreter off."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    run = subprocess.run([sys.executable, test_file], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=timeout)
    assert run.returncode == 0, run.stderr[-3000:]
    return [json.loads(line) for line in run.stdout.splitlines()]
