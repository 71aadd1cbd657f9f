"""The chained MoE launch (kernels/moe/chain_moe.py) against the launches it chains: add_norm_route_triton, then the
one-shot gate/up and down kernels at the same tiles, byte for byte (each phase is its kernel's body; those kernels
have their own float64 checks: test_add_norm_route.py, test_oneshot_gemv.py). Under the interpreter programs run one
after another, so every wait is met when reached; the held-back tests show the waits are real: with a done-counter
held back, the programs that need it give up (SPIN_LIMIT) instead of computing from unfinished data."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton

from strata.bench.moe_decode import synthetic_stack
from strata.kernels.moe.chain_moe import (ARRIVALS, CHAIN_ROUTE_EXPERTS, DOWN_DONE, FINISHED, GATE_UP_DONE, GAVE_UP,
                                          O_DONE, ROUTED, TICKET, ChainConfig, chain_moe_triton, chain_tiles,
                                          counter_device, site_counters)
from strata.kernels.moe.gemv import DecodeExperts, ExpertOperand, down_sum_triton, gate_up_swiglu_triton
from strata.kernels.pointwise.add_norm_route import RouteConfig, add_norm_route_triton
from strata.kernels.pointwise.add_rms_norm import _add_rms_norm_kernel
from strata.kernels.quant.matvec import quant_matvec

ROOT = Path(__file__).resolve().parents[3]
SMALL = ChainConfig(gate_up_bn=16, down_bn=32)  # several items a phase: gate/up 64 rows = 4 tiles, down 128 = 4


def _case(device, fmt="Q4_0", rows=2, n_experts=8, k=2, seed=5):
    embd, ff = (256, 256) if fmt == "Q4_K" else (128, 64)  # Q4_K: rows of whole 256-weight blocks
    stack = synthetic_stack(fmt, fmt, n_experts, embd, ff, seed=seed, device=device)
    gen = torch.Generator().manual_seed(seed)
    dtype = torch.bfloat16
    h = torch.randn(rows, embd, generator=gen).to(dtype).to(device)
    delta = torch.randn(rows, embd, generator=gen).to(dtype).to(device)
    norm = (1 + 0.1 * torch.randn(embd, generator=gen)).to(dtype).to(device)
    router = (0.05 * torch.randn(n_experts, embd, generator=gen)).to(dtype).to(device)
    return dict(h=h, delta=delta, norm_weight=norm, router=router, eps=1e-6, k=k, normalize=True,
                experts=DecodeExperts.of_stack(stack))


def _unchained(case, config, next_norm=None):
    """The launches the chain replaces at its tiles and warps (compiled, a kernel's sums follow its warp count):
    (residual, x, y, H, ids[, the new residual, its norm by next_norm])."""
    tiles = chain_tiles(case["experts"], case["k"], case["h"].is_cuda, config)
    warps = max(t.warps for t in tiles)
    route = RouteConfig(config.route_experts or CHAIN_ROUTE_EXPERTS, warps)
    residual, x, weights, ids = add_norm_route_triton(case["h"], case["delta"], case["norm_weight"], case["router"],
                                                      case["eps"], case["k"], case["normalize"], config=route)
    hid = gate_up_swiglu_triton(x, ids, case["experts"], tiles[0])
    y = down_sum_triton(hid, ids, weights, case["experts"], x.dtype, tiles[1])
    if next_norm is None:
        return residual, x, y, hid, ids
    residual2, out2 = torch.empty_like(residual), torch.empty_like(residual)  # add_rms_norm_triton at those warps
    _add_rms_norm_kernel[(residual.shape[0],)](residual, y, next_norm, residual2, out2, residual.shape[1],
                                               case["eps"], BLOCK=triton.next_power_of_2(residual.shape[1]),
                                               num_warps=warps)
    return residual, x, y, hid, ids, residual2, out2


@pytest.mark.parametrize("fmt, rows, k, join, route", [("Q4_0", 1, 2, False, 0), ("Q8_0", 3, 3, True, 2),
                                                       ("Q4_K", 1, 2, True, 0)])
def test_chained_launch_gives_the_separate_launches_bytes(device, fmt, rows, k, join, route):
    case = _case(device, fmt, rows, k=k)
    config = dataclasses.replace(SMALL, route_experts=route)  # 2: four routing items a token, each 2 router rows
    next_norm = (case["norm_weight"].float() * 0.9).to(case["h"].dtype) if join else None
    want = _unchained(case, config, next_norm)
    for launch in range(2):  # the counters left zero: a second launch runs the same
        buffers = {}
        got = chain_moe_triton(**case, site=("test", fmt), config=config, buffers=buffers, next_norm=next_norm)
        assert got is not None and len(got) == (5 if join else 3)
        for a, b in zip(got, want[:3] + want[5:]):
            assert torch.equal(a, b), launch
        assert torch.equal(buffers["hid"], want[3]) and torch.equal(buffers["ids"], want[4])
        assert not site_counters(case["h"].device, ("test", fmt)).any()


def _held_back(device, counter: int, value: int, join: bool = False):
    case = _case(device, rows=2)
    site = ("held back", counter)
    counters = site_counters(case["h"].device, site)
    counters[counter] = value  # what the done-count is missing: its waiters can never see it complete
    nan = float("nan")
    buffers = {"hid": torch.full((2, 2, 64), nan, device=device), "y": torch.full((2, 128), nan, device=device,
                                                                                 dtype=torch.bfloat16)}
    # A few reads under the interpreter (every wait not met at once is held back); compiled, enough for a routing
    # item running beside the waiter to finish.
    chain_moe_triton(**case, site=site, config=SMALL, buffers=buffers, spin_limit=3 if device == "cpu" else 20000,
                     next_norm=case["norm_weight"] if join else None)
    gave_up = int(counters[GAVE_UP.value])
    counters[GAVE_UP.value] = 0
    assert not counters.any()  # the last program zeroed the rest, the held-back counter too
    return buffers, gave_up, _unchained(case, SMALL)


def test_gate_up_and_down_items_wait_for_the_routing(device):
    buffers, gave_up, want = _held_back(device, ROUTED.value, -1)  # one token's routing never counted
    assert gave_up == 2 * 2 * 4 + 2 * 4  # every gate/up item (2 tokens x 2 experts x 4 tiles) and down item (2 x 4)
    assert buffers["hid"].isnan().all() and buffers["y"].isnan().all()  # none computed from an unfinished routing
    assert torch.equal(buffers["ids"], want[4])  # the routing items themselves ran


def test_down_items_wait_for_every_gate_up_item(device):
    buffers, gave_up, want = _held_back(device, GATE_UP_DONE.value, -1)  # one gate/up item never counted
    assert gave_up == 2 * 4  # every down item, after loading its weights
    assert torch.equal(buffers["hid"], want[3])  # the gate/up items ran
    assert buffers["y"].isnan().all()  # no down item read H before all of it was written


def test_the_join_waits_for_every_down_item(device):
    buffers, gave_up, want = _held_back(device, DOWN_DONE.value, -1, join=True)  # one down item never counted
    assert gave_up == 2  # each token's add + norm
    assert torch.equal(buffers["y"], want[2])  # the down items ran


def test_counters_made_under_cuda_are_found_under_its_index(monkeypatch):
    """`bench moe-chain` made each call's counters under `cuda` and the kernel looked them up under the tensors'
    `cuda:0`: inside a capture none were found and the chained launch declined (session 11's first call)."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert counter_device("cuda") == counter_device(torch.device("cuda", 0)) == torch.device("cuda", 0)
    assert counter_device("cpu") == torch.device("cpu")


def test_counter_layout_leaves_room_for_every_token():
    offsets = [c.value for c in (TICKET, ROUTED, GATE_UP_DONE, FINISHED, GAVE_UP, DOWN_DONE, O_DONE)]
    assert len(set(offsets)) == len(offsets) and max(offsets) < ARRIVALS.value


def test_chain_steps_aside_where_it_does_not_apply(device):
    case = _case(device)
    assert chain_moe_triton(**{**case, "k": 9}, site="no") is None  # top-9 of 8 experts
    sparse = {**case, "experts": DecodeExperts(**{**case["experts"].__dict__, "sparse": True})}
    assert chain_moe_triton(**sparse, site="no") is None  # the misses' launch form


@pytest.mark.skipif(not (Path(__import__("triton").__file__).parent / "backends/nvidia/bin/ptxas").exists(),
                    reason="this Triton build carries no ptxas")
def test_chained_kernel_builds_for_sm90_without_spills():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    run = subprocess.run([sys.executable, str(Path(__file__).with_name("chain_build.py")), "0:0:0:0", "8:8:4:8:0:64"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    builds = [json.loads(line) for line in run.stdout.splitlines()]
    assert len(builds) == 4, builds
    # The q/k/v launch: ptxas keeps it at 32 registers with a 4-byte spill (8-byte frame; sm_90a, measured).
    assert not [b for b in builds if b["stack"] > (8 if b["kernel"] == "_chain_qkv_store_kernel" else 0)], builds


def test_switch_text_names_a_config():
    from strata.errors import StrataError
    from strata.kernels.moe.chain_moe import DEFAULT, parse_config

    assert parse_config("1") == DEFAULT and parse_config("8:8:4") == ChainConfig(8, 8, 4)
    assert parse_config("16") == ChainConfig(16)
    assert parse_config("8:8:4:2") == ChainConfig(8, 8, 4, 2) and parse_config("8:0:0:0:2").route_experts == 2
    assert parse_config("8:0:0:0:0:64").nap_ns == 64
    for bad in ("yes", "8:8:4:2:1:1:1", "8:-1"):
        with pytest.raises(StrataError, match="STRATA_DECODE_CHAIN"):
            parse_config(bad)


def test_bench_runs_and_reports_the_bytes(capsys):
    from strata.bench.moe_chain import main

    assert main(["--shapes", "tiny-q4_0", "--sweep", "0:16:32:16"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any("five launches" in line for line in lines)
    chained = [line for line in lines if "x five" in line]
    assert len(chained) == 2, lines
    assert all("= its five launches' bytes" in line and "!=" not in line for line in chained), lines
    qkv = [line for line in lines if "x two" in line]  # the attention half
    assert len(qkv) == 2 and all("= its two launches' bytes" in line and "!=" not in line for line in qkv), lines


def _o_case(device, rows=2):
    """A case whose delta is the o projection of random heads [rows, 256] by a Q4_0 [128, 256] weight."""
    case = _case(device, rows=rows)
    weight = synthetic_stack("Q4_0", "Q4_0", 1, 256, 128, seed=9, device=device).gate  # [1, 128 rows, 256]
    o = ExpertOperand(weight.raw.contiguous().reshape(-1), int(weight.ggml_type), 128, 256, stride=0)
    heads = torch.randn(rows, 256, generator=torch.Generator().manual_seed(10)).to(torch.bfloat16).to(device)
    return case, heads, o, weight


def test_o_projection_phase_gives_the_matvec_bytes(device):
    case, heads, o, weight = _o_case(device)
    tiles = chain_tiles(case["experts"], case["k"], case["h"].is_cuda, SMALL, o)
    delta = quant_matvec(heads, weight.raw[0], weight.ggml_type, (128, 256), config=tiles[2])
    next_norm = case["norm_weight"]
    want = _unchained({**case, "delta": delta}, SMALL, next_norm)
    buffers = {}
    got = chain_moe_triton(**{**case, "delta": None}, site="o", config=SMALL, next_norm=next_norm, heads=heads, o=o,
                           buffers=buffers)
    assert torch.equal(buffers["delta"], delta)
    for a, b in zip(got, want[:3] + want[5:]):
        assert torch.equal(a, b)
    assert not site_counters(case["h"].device, "o").any()


def test_routing_items_wait_for_the_o_projection(device):
    case, heads, o, _ = _o_case(device)
    counters = site_counters(case["h"].device, "o held back")
    counters[O_DONE.value] = -1  # one o item never counted
    ids = torch.full((2, 2), -1, dtype=torch.int32, device=device)
    chain_moe_triton(**{**case, "delta": None}, site="o held back", config=SMALL, heads=heads, o=o,
                     buffers={"ids": ids}, spin_limit=3 if device == "cpu" else 20000)
    assert int(counters[GAVE_UP.value]) == 2 * 2 + 2 * 2 * 4 + 2 * 4  # routing items, then every later one
    counters[GAVE_UP.value] = 0
    assert not counters.any()
    assert (ids == -1).all()  # no routing from an unfinished delta
