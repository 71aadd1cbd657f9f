"""The one-shot decode GEMVs (`oneshot_gemv.py`: every weight of a program's rows loaded at once) against float64.
Q2_0, Q4_0, Q8_0 and Q4_K: routed gate/up + SwiGLU, routed down, the dense matvec (verify windows of 1..4 rows).

Bound: ERROR_BOUND (1e-5) of max |float64| for H and the outputs, as test_gemv.py. Tiles are small so that the
interpreter runs them in seconds; SPLIT > 1 cuts the input in uneven slices (the last one partial). Run as a script,
this file builds the kernels for sm_90 at the A3B and qwen4exp shapes (the last test: no spills).
"""

import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

if __name__ == "__main__":  # building for the GPU: Triton imported before strata.kernels can switch the interpreter on
    os.environ.pop("TRITON_INTERPRET", None)
    import triton  # noqa: F401

import dataclasses  # noqa: E402

import numpy as np  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from strata.kernels.moe.gemv import (  # noqa: E402
    ERROR_BOUND, DecodeExperts, ExpertOperand, GemvConfig, _takes_oneshot, down_sum_triton, gate_up_swiglu_triton,
    launch_down, moe_gemv_float64, relative_error)

from tests.kernels.moe.partly_cached import cpu_stack, partly_cached  # noqa: E402
from tests.kernels.sm90 import builds_of, needs_ptxas  # noqa: E402


def _oneshot(bn: int, split: int = 1) -> GemvConfig:
    return GemvConfig(bn=bn, ns=4, warps=4, wide=True, split=split, oneshot=True)


@pytest.mark.parametrize("fmt, split", [("Q2_0", 1), ("Q4_0", 3), ("Q8_0", 2), ("Q4_K", 1)])
def test_oneshot_expert_kernels_match_float64(device, fmt, split):
    from strata.bench.moe_decode import routing, synthetic_stack

    # 2 tokens x top 2 of 4 experts; gate/up 48 rows in tiles of 32 (the last partial), down 128 rows in one tile.
    embd, ff = (256, 256) if fmt == "Q4_K" else (128, 64 if fmt != "Q2_0" else 128)
    stack = synthetic_stack(fmt, fmt, 4, embd, ff, seed=61, device=device)
    experts = DecodeExperts.of_stack(stack)
    gen = torch.Generator().manual_seed(62)
    ids, w = routing(2, 2, 4, gen, shared=1)
    x = torch.randn(2, embd, generator=gen)
    h64, y64 = moe_gemv_float64(x, ids, w, DecodeExperts.of_stack(cpu_stack(stack)))
    up, down = _oneshot(32, split), _oneshot(128, split)
    assert _takes_oneshot(up, experts.gate, experts.up) and _takes_oneshot(down, experts.down)
    x, ids, w = x.to(device), ids.to(device), w.to(device)
    h = gate_up_swiglu_triton(x, ids, experts, up)
    y = down_sum_triton(h, ids, w, experts, torch.float32, down)
    assert relative_error(h, h64) <= ERROR_BOUND
    assert relative_error(y, y64) <= ERROR_BOUND
    assert torch.equal(y, down_sum_triton(h, ids, w, experts, torch.float32, down))  # no atomics: repeatable
    if fmt == "Q4_0":  # a token's rows do not depend on the other tokens of the call (a verify window's rows)
        assert torch.equal(h[1:], gate_up_swiglu_triton(x[1:], ids[1:], experts, up))
        assert torch.equal(y[1:], down_sum_triton(h[1:], ids[1:], w[1:], experts, torch.float32, down))


def test_oneshot_kernels_from_slots_leave_missing_experts_out(device):
    case = partly_cached(device, n_experts=6, n_resident=4, n_tokens=2, top_k=3, shared=1, seed=63)
    x, ids, w, cached = case.x, case.ids, case.weights, case.cached
    h = gate_up_swiglu_triton(x, ids, cached, _oneshot(64))
    y = down_sum_triton(h, ids, w, cached, torch.float32, _oneshot(64, 2))
    case.check(h, y)
    # The misses' launch form (programs of absent pairs skip their loads and dots): the same values
    sparse = dataclasses.replace(cached, sparse=True)
    assert torch.equal(gate_up_swiglu_triton(x, ids, sparse, _oneshot(64)), h)
    assert torch.equal(down_sum_triton(h, ids, w, sparse, torch.float32, _oneshot(64, 2)), y)


@pytest.mark.parametrize("fmt", ["Q4_0", "Q4_K"])
def test_dense_matvec_rows_do_not_depend_on_the_window(device, fmt):
    # The dense matvec reads its weight once for all rows of a verify window; each row's sums must be those of a
    # one-row call bit for bit, whatever the window (1..4 rows), and within the bound of float64.
    from strata.kernels.quant.matvec import one_expert
    from strata.quant import dequantize, get_format, random_blocks

    info = get_format(fmt)
    n_out, n_in = 40, 512
    raw = torch.from_numpy(random_blocks(fmt, n_out * n_in // info.block_size, np.random.default_rng(65), 0.02))
    weight = ExpertOperand(raw.to(device), info.ggml_type, n_out, n_in, stride=0)
    x = torch.randn(4, 1, n_in, generator=torch.Generator().manual_seed(66))
    want = x.reshape(4, n_in).double() @ dequantize(raw.reshape(n_out, -1), info.ggml_type, (n_out, n_in)).double().T
    cfg = _oneshot(16)  # 3 row tiles, the last partial
    x = x.to(device)
    alone = [launch_down(x[r:r + 1], *one_expert(torch.device(device), 1), weight, None, torch.float32, cfg)
             for r in range(4)]
    for rows in (2, 3, 4):
        y = launch_down(x[:rows], *one_expert(torch.device(device), rows), weight, None, torch.float32, cfg)
        assert all(torch.equal(y[r], alone[r][0]) for r in range(rows)), rows
    assert relative_error(torch.cat(alone), want) <= ERROR_BOUND


def test_operands_the_oneshot_kernels_cannot_read_take_the_word_kernels(device):
    from strata.bench.moe_decode import routing, synthetic_stack

    q4 = DecodeExperts.of_stack(synthetic_stack("Q4_0", "Q4_0", 4, 128, 64, seed=67, device=device))
    shifted = torch.zeros(q4.gate.raw.numel() + 1, dtype=torch.uint8, device=device)[1:]  # an odd address
    shifted.copy_(q4.gate.raw)
    odd = ExpertOperand(shifted, q4.gate.qtype, q4.gate.rows, q4.gate.cols, q4.gate.stride)
    assert not _takes_oneshot(_oneshot(32), odd, q4.up)
    iq = DecodeExperts.of_stack(synthetic_stack("IQ3_S", "Q2_0", 4, 256, 64, seed=68, device=device))
    assert not _takes_oneshot(_oneshot(32), iq.gate, iq.up)  # no one-shot kernel for the i-quants
    gen = torch.Generator().manual_seed(69)
    ids, w = routing(1, 2, 4, gen)
    x = torch.randn(1, 128, generator=gen)
    h64, _ = moe_gemv_float64(x, ids, w, DecodeExperts.of_stack(cpu_stack(synthetic_stack("Q4_0", "Q4_0", 4, 128, 64,
                                                                                       seed=67))))
    h = gate_up_swiglu_triton(x.to(device), ids.to(device), DecodeExperts(odd, q4.up, q4.down), _oneshot(32))
    assert relative_error(h, h64) <= ERROR_BOUND


def test_oneshot_tiles_fill_the_gpu_within_their_registers_and_the_switch_picks_them(monkeypatch):
    from strata import switches
    from strata.kernels.moe import gemv
    from strata.kernels.moe.decode import SPECS
    from strata.kernels.moe.oneshot_gemv import MIN_WARPS_PER_SM, WORDS_PER_THREAD, slice_units
    from strata.kernels.moe.wide_gemv import SMS, UNIT, WORDS

    shapes = [("matvec", "Q4_0", 5120, 2048, 1), ("matvec", "Q4_0", 2048, 4096, 1), ("down", "Q4_0", 2048, 768, 8),
              ("gate_up", "Q4_0", 768, 2048, 8), ("down", "Q4_K", 2048, 768, 8), ("gate_up", "Q2_0", 640, 2560, 10),
              ("down", "Q2_0", 2560, 640, 10), ("matvec", "Q8_0", 2048, 4096, 1)]
    for kind, fmt, n_out, n_in, top_k in shapes:
        cfg = gemv.oneshot_config(kind, SPECS[fmt], n_out, n_in, top_k, True)
        units = n_in // UNIT[fmt] * (top_k if kind == "down" else 1)
        operands, programs = (2, top_k) if kind == "gate_up" else (1, 1)
        words = operands * slice_units(units, cfg.split)[1] * cfg.bn * WORDS[fmt] / (32 * cfg.warps)
        assert cfg.oneshot and words <= WORDS_PER_THREAD, (kind, fmt, cfg)
        assert programs * -(-n_out // cfg.bn) * cfg.split * cfg.warps >= MIN_WARPS_PER_SM * SMS, (kind, fmt, cfg)
    default = gemv.gemv_config("down", SPECS["Q4_0"], 2048, 768, 8, True)
    assert default.oneshot and (default.bn, default.warps) == (8, 16)  # unset: the measured tile (H200 sweep)
    assert not gemv.gemv_config("down", SPECS["Q4_K"], 2048, 768, 8, True).oneshot  # not measured: streamed
    with switches.override(STRATA_GEMV_ONESHOT=True):
        assert gemv.gemv_config("down", SPECS["Q4_0"], 2048, 768, 8, True) == gemv.oneshot_config(
            "down", SPECS["Q4_0"], 2048, 768, 8, True)
        assert not gemv.gemv_config("gate_up", SPECS["IQ3_S"], 640, 2560, 10, True).oneshot  # no one-shot kernel
        assert not gemv.gemv_config("down", SPECS["Q4_0"], 2048, 768, 8, False).oneshot  # the interpreter's tiles
    monkeypatch.setitem(gemv.MEASURED_TILES, ("matvec", "Q4_0"), dict(oneshot=True, bn=4, warps=8))  # a sweep line
    measured = gemv.gemv_config("matvec", SPECS["Q4_0"], 5120, 2048, 1, True)
    assert measured.oneshot and (measured.bn, measured.warps, measured.split) == (4, 8, 1)


def _build_sm90() -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from strata.kernels.moe import oneshot_gemv
    from strata.kernels.moe.decode import SPECS
    from strata.kernels.moe.gemv import oneshot_config

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    down = {"h": "*fp32", "ids": "*i32", "topk_w": "*fp32", "slot_of": "*i32", "wd": "*u8", "y": "*fp32",
            "stride_d": "i64"}
    up = {"x": "*bf16", "ids": "*i32", "slot_of": "*i32", "wg": "*u8", "wu": "*u8", "hid": "*fp32",
          "stride_g": "i64", "stride_u": "i64"}
    for kind, fmt, n_out, n_in, top_k, rows in BUILDS:
        spec, cfg = SPECS[fmt], oneshot_config(kind, SPECS[fmt], n_out, n_in, top_k, True)
        if kind == "gate_up":
            kernel, signature = oneshot_gemv._oneshot_gate_up_kernel, up
            constants = {**oneshot_gemv._constants(spec, n_out, n_in, 1, True, cfg.bn, cfg.split), "TOP_K": top_k}
        else:
            kernel, signature = oneshot_gemv._oneshot_down_kernel, {**down, "h": "*bf16"} if kind == "matvec" else down
            constants = {**oneshot_gemv._constants(spec, n_out, n_in, top_k, kind == "down", cfg.bn, cfg.split),
                         "ROWS": rows, "SHARED": kind == "matvec"}
        attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in signature}
        source = ASTSource(kernel, {**signature, **{k: "constexpr" for k in constants}}, constants, attrs=attrs)
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg.warps})
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(compiled.asm["cubin"])
            f.flush()
            usage = subprocess.run([str(cuobjdump), "--dump-resource-usage", f.name], capture_output=True,
                                   text=True).stdout
        regs, stack = re.search(r"REG:(\d+) STACK:(\d+)", usage).groups()
        print(json.dumps({"kernel": kind, "fmt": fmt, "rows": rows, "regs": int(regs), "stack": int(stack),
                          "config": [cfg.bn, cfg.warps, cfg.split]}), flush=True)


BUILDS = [("matvec", "Q4_0", 5120, 2048, 1, 1), ("matvec", "Q4_0", 5120, 2048, 1, 4), ("down", "Q4_0", 2048, 768, 8, 1),
          ("gate_up", "Q4_0", 768, 2048, 8, 1), ("down", "Q4_K", 2048, 768, 8, 1), ("gate_up", "Q4_K", 768, 2048, 8, 1),
          ("gate_up", "Q2_0", 640, 2560, 10, 1), ("down", "Q2_0", 2560, 640, 10, 1)]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the tests above compile the kernels themselves")
@needs_ptxas
def test_oneshot_kernels_build_for_sm90_without_spills():
    builds = builds_of(__file__, timeout=600)
    assert len(builds) == len(BUILDS) and not [b for b in builds if b["stack"]], builds


if __name__ == "__main__":
    _build_sm90()
