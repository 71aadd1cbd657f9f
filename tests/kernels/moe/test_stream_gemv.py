"""The streamed word kernels (`stream_gemv.py`: persistent programs, next step loaded ahead) against float64.
Q2_0, Q4_0, Q8_0 and Q4_K.

Bound: ERROR_BOUND (1e-5) of max |float64| for H and the output, as test_gemv.py. Under the interpreter they must
also equal the word kernels of the same tile bit for bit (same sums in the same order, only the schedule differs).
Grids are chosen to leave remainders: programs with one item more than others, items ending mid-step.
"""

from dataclasses import replace

import pytest
import torch

from strata.bench.moe_decode import routing, synthetic_stack
from strata.kernels.moe.gemv import (ERROR_BOUND, DecodeExperts, GemvConfig, _takes_stream, down_sum_triton,
                                     gate_up_swiglu_triton, launch_down, moe_gemv_float64, relative_error)
from tests.kernels.moe.partly_cached import cpu_stack, partly_cached

# gate/up: 2 steps of 2 units (Q2_0: 1 step) over 64-row tiles; down: k * units flattened, 4 a step (a partial last)
WORDS_UP = GemvConfig(bn=32, ns=2, warps=4, wide=True)
WORDS_DOWN = GemvConfig(bn=64, ns=4, warps=4, wide=True)


def _interpreted(device) -> bool:
    return device != "cuda"


@pytest.mark.parametrize("fmt, per_sm", [("Q2_0", 5), ("Q4_0", 1), ("Q4_0", 5), ("Q8_0", 5)])
def test_streamed_kernels_match_float64_and_the_word_kernels(device, fmt, per_sm):
    # 2 tokens x top 3: 6 pairs x 3 row tiles of gate/up (96 rows: the last tile partial) = 18 items over 1 or 5
    # programs (under the interpreter an "SM" is one program); down: 2 tokens x 2 row tiles of 128 rows.
    stack = synthetic_stack(fmt, fmt, 8, 128, 96 if fmt != "Q2_0" else 128, seed=41, device=device)
    experts = DecodeExperts.of_stack(stack)
    gen = torch.Generator().manual_seed(42)
    ids, w = routing(2, 3, 8, gen, shared=1)
    x = torch.randn(2, 128, generator=gen)
    h64, y64 = moe_gemv_float64(x, ids, w, DecodeExperts.of_stack(cpu_stack(stack)))
    up, down = replace(WORDS_UP, stream=per_sm), replace(WORDS_DOWN, stream=per_sm)
    assert _takes_stream(up, experts.gate, experts.up) and _takes_stream(down, experts.down)
    x, ids, w = x.to(device), ids.to(device), w.to(device)
    h = gate_up_swiglu_triton(x, ids, experts, up)
    y = down_sum_triton(h, ids, w, experts, torch.float32, down)
    assert relative_error(h, h64) <= ERROR_BOUND
    assert relative_error(y, y64) <= ERROR_BOUND
    assert torch.equal(y, down_sum_triton(h, ids, w, experts, torch.float32, down))  # no atomics: repeatable
    if _interpreted(device):
        assert torch.equal(h, gate_up_swiglu_triton(x, ids, experts, WORDS_UP))
        assert torch.equal(y, down_sum_triton(h, ids, w, experts, torch.float32, WORDS_DOWN))


def test_experts_of_one_unit_width_stream_too(device):
    # The trained default model's shape: Q8_0, 32 hidden units, so the down dot is one 32-weight unit an expert.
    stack = synthetic_stack("Q8_0", "Q8_0", 8, 256, 32, seed=56, device=device)
    experts = DecodeExperts.of_stack(stack)
    gen = torch.Generator().manual_seed(57)
    ids, w = routing(2, 4, 8, gen, shared=1)
    x = torch.randn(2, 256, generator=gen)
    h64, y64 = moe_gemv_float64(x, ids, w, DecodeExperts.of_stack(cpu_stack(stack)))
    x, ids, w = x.to(device), ids.to(device), w.to(device)
    h = gate_up_swiglu_triton(x, ids, experts, GemvConfig(bn=16, ns=4, warps=4, wide=True, stream=3))
    y = down_sum_triton(h, ids, w, experts, torch.float32, GemvConfig(bn=64, ns=2, warps=4, wide=True, stream=3))
    assert relative_error(h, h64) <= ERROR_BOUND and relative_error(y, y64) <= ERROR_BOUND


def test_streamed_q4_k_matches_float64_and_the_word_kernels(device):
    # 256 x 256: gate/up 4 slice pairs a row (2 steps), down 4 a row x top 2 (2 steps of 4); 4 programs, 8 items.
    stack = synthetic_stack("Q4_K", "Q4_K", 4, 256, 256, seed=52, device=device)
    experts = DecodeExperts.of_stack(stack)
    gen = torch.Generator().manual_seed(53)
    ids, w = routing(1, 2, 4, gen)
    x = torch.randn(1, 256, generator=gen)
    h64, y64 = moe_gemv_float64(x, ids, w, DecodeExperts.of_stack(cpu_stack(stack)))
    up, down = GemvConfig(bn=64, ns=2, warps=4, wide=True), GemvConfig(bn=128, ns=4, warps=4, wide=True)
    assert _takes_stream(replace(up, stream=4), experts.gate, experts.up)
    x, ids, w = x.to(device), ids.to(device), w.to(device)
    h = gate_up_swiglu_triton(x, ids, experts, replace(up, stream=4))
    y = down_sum_triton(h, ids, w, experts, torch.float32, replace(down, stream=4))
    assert relative_error(h, h64) <= ERROR_BOUND
    assert relative_error(y, y64) <= ERROR_BOUND
    if _interpreted(device):
        assert torch.equal(h, gate_up_swiglu_triton(x, ids, experts, up))
        assert torch.equal(y, down_sum_triton(h, ids, w, experts, torch.float32, down))


def test_streamed_kernels_from_slots_leave_missing_experts_out(device):
    case = partly_cached(device, n_experts=12, n_resident=9, n_tokens=3, top_k=4, shared=2, seed=43)
    x, ids, w, cached = case.x, case.ids, case.weights, case.cached
    h = gate_up_swiglu_triton(x, ids, cached, replace(WORDS_UP, stream=3))
    y = down_sum_triton(h, ids, w, cached, torch.float32, replace(WORDS_DOWN, stream=3))
    case.check(h, y)


def test_dense_matvec_through_the_streamed_down_kernel(device):
    from strata.kernels.moe.gemv import ExpertOperand
    from strata.kernels.quant.matvec import one_expert
    from strata.quant import dequantize, get_format, random_blocks
    import numpy as np

    info = get_format("Q4_0")
    raw = torch.from_numpy(random_blocks("Q4_0", 80 * 256 // 32, np.random.default_rng(45), 0.02))
    weight = ExpertOperand(raw.to(device), info.ggml_type, 80, 256, stride=0)
    x = torch.randn(1, 1, 256, generator=torch.Generator().manual_seed(46))
    want = x.reshape(1, 256).double() @ dequantize(raw.reshape(80, -1), info.ggml_type, (80, 256)).double().T
    ids, ones = one_expert(torch.device(device), 1)
    cfg = GemvConfig(bn=32, ns=4, warps=4, wide=True, stream=2)  # 3 row tiles (the last partial), 2 steps each
    assert relative_error(launch_down(x.to(device), ids, ones, weight, None, torch.float32, cfg), want) <= ERROR_BOUND


def test_formats_and_offsets_the_streamed_kernels_cannot_read_take_the_word_or_byte_kernels(device):
    stack = synthetic_stack("IQ3_S", "Q2_0", 4, 256, 64, seed=47, device=device)
    experts = DecodeExperts.of_stack(stack)
    assert not _takes_stream(replace(WORDS_UP, stream=2), experts.gate, experts.up)  # IQ3_S: the word kernels
    q4 = DecodeExperts.of_stack(synthetic_stack("Q4_0", "Q4_0", 4, 128, 64, seed=48, device=device))
    shifted = torch.zeros(q4.gate.raw.numel() + 1, dtype=torch.uint8, device=device)[1:]  # an odd address
    shifted.copy_(q4.gate.raw)
    odd = type(q4.gate)(shifted, q4.gate.qtype, q4.gate.rows, q4.gate.cols, q4.gate.stride)
    assert not _takes_stream(replace(WORDS_UP, stream=2), odd, q4.up)
    from strata.kernels.moe.decode import SPECS
    from strata.kernels.moe.stream_gemv import stream_applies

    assert stream_applies(SPECS["Q8_0"], 151936, 2176, 0, 0)  # a 2048-wide head: offsets fit in 32 bits
    assert not stream_applies(SPECS["Q8_0"], 262144, 8704, 0, 0)  # 2.3 GB of rows: the word kernels
    gen = torch.Generator().manual_seed(49)
    ids, w = routing(1, 2, 4, gen)
    x = torch.randn(1, 128, generator=gen)
    h64, _ = moe_gemv_float64(x, ids, w, DecodeExperts.of_stack(cpu_stack(synthetic_stack("Q4_0", "Q4_0", 4, 128, 64,
                                                                                       seed=48))))
    h = gate_up_swiglu_triton(x.to(device), ids.to(device), DecodeExperts(odd, q4.up, q4.down),
                              replace(WORDS_UP, stream=2))
    assert relative_error(h, h64) <= ERROR_BOUND


def test_stream_sweep_lists_the_default_then_streamed_configs_and_checks_them(device, monkeypatch):
    import io

    from strata.bench import gemv_sweep, moe_decode
    from strata.kernels.moe import gemv
    from strata.kernels.moe.decode import SPECS

    # the word kernels' tile of session 4 as the default (8 warps: 32 warps an SM are 4 programs)
    monkeypatch.setitem(gemv.MEASURED_TILES, ("gate_up", "Q4_0"), dict(ns=32, warps=8))
    a3b = gemv_sweep.sweep_configs("gate_up", SPECS["Q4_0"], 768, 2048, 8, family="stream")
    assert a3b[0].stream == 0 and all(c.stream != 0 and c.split == 1 for c in a3b[1:])
    assert {c.stream for c in a3b} >= {-1, 1, 4, 8, gemv_sweep.ONE_TILE_EACH} and len(set(a3b)) == len(a3b)  # 8 warps
    assert not [c for c in gemv_sweep.sweep_configs("gate_up", SPECS["IQ3_S"], 640, 2560, 10) if c.stream]
    assert not [c for c in gemv_sweep.sweep_configs("down", SPECS["Q4_0"], 2048, 768, 8, family="words") if c.stream]

    stack = synthetic_stack("Q4_0", "Q4_0", 6, 128, 64, seed=50, device=device)
    experts = DecodeExperts.of_stack(stack)
    gen = torch.Generator().manual_seed(51)
    calls = []
    for _ in range(2):
        ids, w = routing(1, 2, 6, gen)
        calls.append((torch.randn(1, 128, generator=gen).to(device), ids.to(device), w.to(device), experts,
                      torch.float32))
    want = moe_gemv_float64(calls[0][0].cpu(), calls[0][1].cpu(), calls[0][2].cpu(),
                            DecodeExperts.of_stack(cpu_stack(stack)))
    seen = []
    monkeypatch.setattr(moe_decode, "sweep_configs", lambda kind, spec, n_out, n_in, top_k, family="all": seen.append(
        family) or [WORDS_UP if kind == "gate_up" else WORDS_DOWN, replace(WORDS_UP, stream=2)])
    out = io.StringIO()
    assert moe_decode._sweep("tiny", experts, calls, device, 1e9, out, want, "stream"), out.getvalue()
    lines = out.getvalue().splitlines()
    assert seen == ["stream", "stream"] and len(lines) == 4 and "FAIL" not in out.getvalue()
    assert "words" in lines[0] and "stream" in lines[1] and "per_sm=2" in lines[1]
    if _interpreted(device):  # the streamed kernel on the word kernel's tile: the same sums, the same bytes
        assert "same bytes" in lines[1]


def test_the_stream_switch_picks_the_streamed_kernels_on_a_gpu_only(monkeypatch):
    from strata import switches
    from strata.kernels.moe import gemv
    from strata.kernels.moe.decode import SPECS
    from strata.kernels.moe.gemv import gemv_config

    monkeypatch.delitem(gemv.MEASURED_TILES, ("gate_up", "Q4_0"))  # a word-kernel default for the switch to turn
    for key in (("matvec", "Q8_0"), ("down", "Q4_0")):  # (a measured one-shot tile is kept as it is)
        monkeypatch.delitem(gemv.MEASURED_TILES, key)

    default = gemv_config("gate_up", SPECS["Q4_0"], 768, 2048, 8, True)
    assert default.stream == 0  # unset: the word kernels' default, output bytes unchanged
    with switches.override(STRATA_GEMV_STREAM=32):  # warps an SM
        assert gemv_config("gate_up", SPECS["Q4_0"], 768, 2048, 8, True) == replace(default, stream=32 // default.warps)
        matvec = gemv_config("matvec", SPECS["Q8_0"], 2048, 4096, 1, True)
        assert matvec.stream == max(1, 32 // matvec.warps)
        assert gemv_config("gate_up", SPECS["IQ3_S"], 640, 2560, 10, True).stream == 0  # no streamed kernel
        assert gemv_config("down", SPECS["Q4_0"], 2048, 768, 8, False).stream == 0  # the interpreter's tiles
    with switches.override(STRATA_GEMV_STREAM=-1):
        assert gemv_config("down", SPECS["Q4_0"], 2048, 768, 8, True).stream == -1  # as many as stay resident


def test_resident_programs_follow_registers_warps_and_shared_memory():
    from strata.kernels.moe.stream_gemv import resident_programs

    assert resident_programs(76, 8, 0) == 3  # 80 registers x 256 threads: 3 x 20,480 of 65,536
    assert resident_programs(57, 16, 0) == 2
    assert resident_programs(255, 4, 100 * 1024) == 2  # both registers and shared memory allow 2
    assert resident_programs(32, 1, 0) == 32  # at most 32 programs an SM
    assert resident_programs(40, 16, 0) == 3  # 64 warps an SM: registers would allow 3.2


def test_as_many_programs_as_fit_run_the_same_sums(device):
    stack = synthetic_stack("Q4_0", "Q4_0", 6, 128, 64, seed=54, device=device)
    experts = DecodeExperts.of_stack(stack)
    gen = torch.Generator().manual_seed(55)
    ids, w = routing(1, 3, 6, gen)
    x = torch.randn(1, 128, generator=gen)
    h64, y64 = moe_gemv_float64(x, ids, w, DecodeExperts.of_stack(cpu_stack(stack)))
    x, ids, w = x.to(device), ids.to(device), w.to(device)
    h = gate_up_swiglu_triton(x, ids, experts, replace(WORDS_UP, stream=-1))
    y = down_sum_triton(h, ids, w, experts, torch.float32, replace(WORDS_DOWN, stream=-1))
    assert relative_error(h, h64) <= ERROR_BOUND and relative_error(y, y64) <= ERROR_BOUND
    assert torch.equal(h, gate_up_swiglu_triton(x, ids, experts, replace(WORDS_UP, stream=1)))


def test_a_measured_streamed_tile_is_taken_whole(monkeypatch):
    from strata.kernels.moe import gemv
    from strata.kernels.moe.decode import SPECS

    monkeypatch.delitem(gemv.MEASURED_TILES, ("down", "Q2_0"))
    word = gemv.gemv_config("down", SPECS["Q2_0"], 2560, 640, 10, True)
    assert word.ns == 16  # word_tile's (cover pads 100 units by at most a quarter)
    monkeypatch.setitem(gemv.MEASURED_TILES, ("down", "Q2_0"), dict(bn=8, ns=32, warps=8, stream=-1))
    assert gemv.gemv_config("down", SPECS["Q2_0"], 2560, 640, 10, True) == replace(word, bn=8, ns=32, warps=8,
                                                                                   stream=-1)


def test_fit_reads_the_compiled_kernels_registers_once_and_falls_back_without_them():
    from types import SimpleNamespace

    from strata.kernels.moe import stream_gemv

    calls = []

    def warmup(*args, grid, num_warps, **constants):
        calls.append(num_warps)
        return SimpleNamespace(n_regs=76, metadata=SimpleNamespace(shared=1024), _init_handles=lambda: None)

    kernel = SimpleNamespace(fn=SimpleNamespace(__name__="fake_fit_kernel"), warmup=warmup)
    cuda = torch.device("cuda", 0)
    assert stream_gemv._per_sm(kernel, -1, cuda, (), {"BN": 4}, 8) == 3  # 76 registers, 8 warps: 3 resident
    assert stream_gemv._per_sm(kernel, -1, cuda, (), {"BN": 4}, 8) == 3 and calls == [8]  # compiled once
    assert stream_gemv._per_sm(kernel, 5, cuda, (), {"BN": 4}, 8) == 5  # a number is taken as given

    def broken(*args, **kwargs):
        raise RuntimeError("no registers here")

    kernel = SimpleNamespace(fn=SimpleNamespace(__name__="fake_broken_kernel"), warmup=broken)
    assert stream_gemv._per_sm(kernel, -1, cuda, (), {"BN": 4}, 8) == 4  # half of 64 warps
