"""The decode step's kernels built for sm_90 without a GPU (pdl_build.py, in a process without the interpreter):
the default form holds no grid dependency instruction (STRATA_PDL unset compiles as before); the PDL form waits
once, before every store, and lets the next kernel launch (mode 1: before any load; mode 2: after the wait); the
kernels that stream weights no kernel of the step writes (the dense matvec, the router, the norms; STRATA_PDL=3's
experts' down kernel, its routing complete at its launch) issue those loads before the wait, the others none."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton

ROOT = Path(__file__).resolve().parents[3]
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
WEIGHTS_FIRST = {"add_rms_norm", "rms_norm", "add_norm_route", "shared_gate_add_norm", "oneshot_qkv",
                 "oneshot_down_routing_ahead"}
# Loads a thread issues before the wait: exactly its share of the weight (2048 wide, 8 warps; the router's 4 rows)
WEIGHT_LOADS = {"add_rms_norm": 2048 // 256, "rms_norm": 2048 // 256, "add_norm_route": 4 * 2048 // 256,
                "shared_gate_add_norm": 2048 // 256}


@pytest.mark.skipif(not PTXAS.exists(), reason="this Triton build carries no ptxas")
def test_pdl_forms_wait_before_their_stores_and_dependent_loads():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    run = subprocess.run([sys.executable, str(Path(__file__).with_name("pdl_build.py")), "--modes"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    builds = [json.loads(line) for line in run.stdout.splitlines()]
    assert {b["kernel"] for b in builds} == WEIGHTS_FIRST | {"qk_norm_rope_store", "decode_short", "oneshot_down",
                                                           "oneshot_gate_up", "split_sum"}
    by = {(b["kernel"], b["mode"]): b for b in builds}
    for mode in (1, 2):  # the routing read ahead moves the down kernel's loads, it adds or drops none
        assert by["oneshot_down_routing_ahead", mode]["loads"] == by["oneshot_down", mode]["loads"]
    for b in builds:
        assert b["first_load"] >= 0 and b["first_store"] >= 0, b
        if b["mode"] == 0:
            assert b["waits"] == b["triggers"] == 0, b
            continue
        assert b["waits"] == 1 and b["triggers"] == 1 and b["first_wait"] < b["first_store"], b
        if b["mode"] == 1:
            assert b["first_trigger"] < min(b["first_load"], b["first_wait"]), b
        else:
            assert b["first_wait"] < b["first_trigger"], b
        weights_first = b["kernel"] in WEIGHTS_FIRST
        assert (b["first_load"] < b["first_wait"]) == weights_first, b
        assert b["ahead"] == {"oneshot_qkv": 1, "oneshot_down_routing_ahead": 2}.get(b["kernel"], 0), b
        if b["kernel"] in WEIGHT_LOADS:
            assert b["loads_before_wait"] == WEIGHT_LOADS[b["kernel"]], b
        if b["ahead"]:  # the weights' loads (most of them) before the wait; the activations and combine weights after
            assert b["loads_before_wait"] >= 2 * (b["loads"] - b["loads_before_wait"]) > 0, b
