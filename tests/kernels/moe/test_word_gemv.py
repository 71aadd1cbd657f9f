"""The word kernels' launch parameters (`wide_gemv.py`): Q2_0's words and the split over the input, against float64.

Bound: ERROR_BOUND (1e-5) of max |float64| for H and the output, as test_gemv.py; a split only reorders float32 sums.
"""

import pytest
import torch

from strata.bench.moe_decode import routing, slots_of, synthetic_stack
from strata.kernels.moe.decode import SPECS
from strata.kernels.moe.gemv import (ERROR_BOUND, DecodeExperts, GemvConfig, _takes_words, down_sum_triton,
                                     gate_up_swiglu_triton, gemv_config, moe_gemv_float64, moe_gemv_triton,
                                     relative_error)
from strata.kernels.moe.wide_gemv import units_per_slice


def _cpu_experts(stack, slot_order=None, n_slots=0):
    if slot_order is None:
        return DecodeExperts.of_stack(stack)
    slots, table = slots_of(stack, slot_order, n_slots)
    return DecodeExperts.of_slots(slots, table, stack)


@pytest.mark.parametrize("split", [1, 2, 3])
def test_q2_0_words_with_the_input_split_match_float64_and_repeat_bit_for_bit(device, split):
    # ff 192: the down dot is 3 Q2_0 units per expert, 9 over top 3; gate/up: 4 units, so split 3 leaves a slice
    # empty (it must add exactly nothing). 192 gate rows over BN 128: the last row block is partial.
    stack = synthetic_stack("Q2_0", "Q2_0", 8, 256, 192, seed=21, device=device)
    experts = DecodeExperts.of_stack(stack)
    gen = torch.Generator().manual_seed(22)
    ids, w = routing(2, 3, 8, gen, shared=1)
    x = torch.randn(2, 256, generator=gen)
    h64, y64 = moe_gemv_float64(x, ids, w, _cpu_experts(_to_cpu(stack)))
    up_cfg = GemvConfig(bn=128, ns=2, warps=4, wide=True, split=split)
    down_cfg = GemvConfig(bn=256, ns=4, warps=4, wide=True, split=split)
    assert _takes_words(up_cfg, experts.gate, experts.up) and _takes_words(down_cfg, experts.down)
    x, ids, w = x.to(device), ids.to(device), w.to(device)
    h = gate_up_swiglu_triton(x, ids, experts, up_cfg)
    y = down_sum_triton(h, ids, w, experts, torch.float32, down_cfg)
    assert relative_error(h, h64) <= ERROR_BOUND
    assert relative_error(y, y64) <= ERROR_BOUND
    assert torch.equal(y, down_sum_triton(h, ids, w, experts, torch.float32, down_cfg))  # no atomics


def test_split_words_from_slots_leave_missing_experts_out(device):
    stack = synthetic_stack("Q4_0", "Q4_0", 12, 128, 96, seed=23, device=device)
    gen = torch.Generator().manual_seed(24)
    order = torch.randperm(12, generator=gen)
    cached = _cpu_experts(stack, order, 9)  # experts order[9:] are not resident: they add exactly zero
    ids, w = routing(3, 5, 12, gen, shared=2)
    x = torch.randn(3, 128, generator=gen)
    resident = torch.isin(ids, order[:9])
    assert not resident.all() and resident.any()
    _, want = moe_gemv_float64(x, ids, w * resident, DecodeExperts.of_stack(_to_cpu(stack)))
    cfgs = (GemvConfig(bn=128, ns=2, warps=4, wide=True, split=2), GemvConfig(bn=128, ns=8, warps=4, wide=True, split=4))
    y = moe_gemv_triton(x.to(device), ids.to(device), w.to(device), cached, torch.float32, cfgs)
    assert relative_error(y, want) <= ERROR_BOUND


def test_q2_0_at_odd_offsets_takes_the_byte_kernels(device):
    stack = synthetic_stack("Q2_0", "Q2_0", 4, 128, 64, seed=25, device=device)
    experts = DecodeExperts.of_stack(stack)
    shifted = torch.zeros(experts.gate.raw.numel() + 1, dtype=torch.uint8, device=device)[1:]  # an odd address
    shifted.copy_(experts.gate.raw)
    cfg = GemvConfig(bn=64, ns=2, warps=4, wide=True)
    odd = type(experts.gate)(shifted, experts.gate.qtype, experts.gate.rows, experts.gate.cols, experts.gate.stride)
    assert not _takes_words(cfg, odd, experts.up) and _takes_words(cfg, experts.gate, experts.up)
    odd_experts = DecodeExperts(odd, experts.up, experts.down)
    gen = torch.Generator().manual_seed(26)
    ids, w = routing(1, 3, 4, gen)
    x = torch.randn(1, 128, generator=gen)
    h64, _ = moe_gemv_float64(x, ids, w, DecodeExperts.of_stack(_to_cpu(stack)))
    assert relative_error(gate_up_swiglu_triton(x.to(device), ids.to(device), odd_experts, cfg), h64) <= ERROR_BOUND


def test_gpu_defaults_split_only_the_starved_grid(monkeypatch):
    # The word kernels' tiles (session 4's MEASURED_TILES; the streamed kernels' since session 5 take no split): A3B's
    # Q4_0 gate/up takes the sweep's tile, its down the reasoned one; qwen4exp's Q2_0 down projection (2560 rows,
    # 100 units of 16: 640 programs of 4 warps, 19 warps an SM) is cut in two slices of 4 and 3 steps.
    from strata.kernels.moe import gemv

    monkeypatch.setattr(gemv, "MEASURED_TILES", {("gate_up", "Q4_0"): dict(ns=32, warps=8), ("gate_up", "Q4_K"):
                        dict(warps=4), ("gate_up", "Q2_0"): dict(ns=8, warps=2), ("down", "Q4_K"): dict(bn=8)})
    a3b = [gemv_config(kind, SPECS["Q4_0"], n_out, n_in, 8, True)
           for kind, n_out, n_in in (("gate_up", 768, 2048), ("down", 2048, 768))]
    assert [(c.bn, c.ns, c.warps, c.split, c.wide) for c in a3b] == [(4, 32, 8, 1, True), (4, 64, 16, 1, True)]
    gate_up = gemv_config("gate_up", SPECS["Q2_0"], 640, 2560, 10, True)
    down = gemv_config("down", SPECS["Q2_0"], 2560, 640, 10, True)
    assert (gate_up.wide, gate_up.ns, gate_up.warps, gate_up.split) == (True, 8, 2, 1)
    assert (down.wide, down.bn, down.ns, down.warps, down.split) == (True, 4, 16, 4, 2)
    assert units_per_slice(100, 16, 2) == 64
    assert all(c.split == 1 for c in (gemv_config("down", SPECS["Q2_0"], 2560, 640, 10, False),
                                      gemv_config("matvec", SPECS["Q4_K"], 151936, 2048, 1, True)))


def _to_cpu(stack):
    from strata.engine.experts import ExpertStack

    return ExpertStack(*(p.to("cpu") for p in (stack.gate, stack.up, stack.down)))


def test_moe_decode_sweep_times_and_checks_each_config(device, monkeypatch):
    import io

    from strata.bench import moe_decode
    from strata.kernels.moe.gemv import byte_config

    stack = synthetic_stack("Q2_0", "Q2_0", 6, 128, 64, seed=27, device=device)
    experts = DecodeExperts.of_stack(stack)
    gen = torch.Generator().manual_seed(28)
    calls = []
    for _ in range(2):
        ids, w = routing(1, 2, 6, gen)
        calls.append((torch.randn(1, 128, generator=gen).to(device), ids.to(device), w.to(device), experts,
                      torch.float32))
    want = moe_gemv_float64(calls[0][0].cpu(), calls[0][1].cpu(), calls[0][2].cpu(), _cpu_experts(_to_cpu(stack)))
    # Interpreter-sized tiles in place of the GPU's (whose many small programs the interpreter runs slowly).
    monkeypatch.setattr(moe_decode, "sweep_configs", lambda kind, spec, n_out, n_in, top_k, family="all": [
        GemvConfig(bn=128, ns=2, warps=4, wide=True, split=2), byte_config(kind, spec, n_out, n_in, top_k, False)])
    out = io.StringIO()
    assert moe_decode._sweep("tiny", experts, calls, device, 1e9, out, want), out.getvalue()
    lines = out.getvalue().splitlines()
    assert len(lines) == 4 and all("1.00x default" in lines[i] for i in (0, 2)) and "FAIL" not in out.getvalue()
    assert "split=2" in lines[0] and "bytes" in lines[1]


@pytest.mark.parametrize("fmt", ["IQ2_XS", "IQ3_XXS", "IQ3_S"])
def test_lattice_iquant_words_match_float64(device, fmt):
    # qwen4exp's pairing: i-quant gate/up (2560 = 10 super-blocks), Q2_0 down (640 is no multiple of 256).
    stack = synthetic_stack(fmt, "Q2_0", 6, 512, 64, seed=29, device=device)
    experts = DecodeExperts.of_stack(stack)
    gen = torch.Generator().manual_seed(30)
    ids, w = routing(2, 3, 6, gen, shared=1)
    x = torch.randn(2, 512, generator=gen)
    h64, y64 = moe_gemv_float64(x, ids, w, _cpu_experts(_to_cpu(stack)))
    cfg = gemv_config("gate_up", experts.gate.spec, 64, 512, 3, False)
    assert cfg.wide and _takes_words(cfg, experts.gate, experts.up)
    x, ids, w = x.to(device), ids.to(device), w.to(device)
    split = GemvConfig(bn=64, ns=4, warps=4, wide=True, split=2)  # 16 sub-blocks: two slices of two steps
    h = gate_up_swiglu_triton(x, ids, experts, split)  # (the default tiles: test_gemv.py's IQ2_XS / Q2_0 pair)
    assert relative_error(h, h64) <= ERROR_BOUND
    assert relative_error(down_sum_triton(h, ids, w, experts), y64) <= ERROR_BOUND
