"""The decode expert kernels (gate/up + SwiGLU, weighted down sum) against float64 on the dequantized weights.

Bound: max |kernel - float64| <= ERROR_BOUND (1e-5) * max |float64|, for H and for the output (float32 summation
is the only error: measured ~2e-7). Run as a script, this file builds the kernels for sm_90 (see the last test).
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

import pytest  # noqa: E402
import torch  # noqa: E402

from strata.bench.moe_decode import routing, slots_of, synthetic_stack  # noqa: E402
from strata.errors import StrataError  # noqa: E402
from strata.kernels.moe.gemv import (  # noqa: E402
    ERROR_BOUND, DecodeExperts, gate_up_swiglu_triton, moe_gemv, moe_gemv_float64, moe_gemv_ref, moe_gemv_triton,
    relative_error)

from tests.kernels.sm90 import builds_of, needs_ptxas  # noqa: E402


def check(x, ids, w, experts, out_dtype=torch.float32):
    h64, y64 = moe_gemv_float64(x.cpu(), ids.cpu(), w.cpu(), _cpu(experts))
    h = gate_up_swiglu_triton(x, ids, experts)
    y = moe_gemv_triton(x, ids, w, experts, out_dtype)
    assert relative_error(h, h64) <= ERROR_BOUND
    assert relative_error(y, y64) <= ERROR_BOUND
    return y.cpu(), y64


def _cpu(experts: DecodeExperts) -> DecodeExperts:
    parts = [type(m)(m.raw.cpu(), m.qtype, m.rows, m.cols, m.stride) for m in (experts.gate, experts.up, experts.down)]
    return DecodeExperts(*parts, slot_of=None if experts.slot_of is None else experts.slot_of.cpu())


@pytest.mark.parametrize("pair", ["Q2_0 / Q2_0", "Q4_0 / Q4_0", "Q8_0 / Q8_0", "Q4_K / Q4_K", "IQ2_XS / Q2_0"])
def test_formats_against_float64_with_repeated_experts(device, pair):
    gate_up, down = (s.strip() for s in pair.split("/"))
    n_ff = 256 if down == "Q4_K" else 64
    stack = synthetic_stack(gate_up, down, 16, 256, n_ff, seed=len(pair), device=device)
    gen = torch.Generator().manual_seed(0)
    ids, w = routing(3, 6, 16, gen, shared=3)  # tokens 1 and 2 repeat three of token 0's experts
    x = torch.randn(3, 256, generator=gen)
    y, y64 = check(x.to(device), ids.to(device), w.to(device), DecodeExperts.of_stack(stack))
    assert relative_error(moe_gemv_ref(x, ids, w, _cpu(DecodeExperts.of_stack(stack))), y64) <= ERROR_BOUND


@pytest.mark.parametrize("fmt", ["Q4_0", "Q8_0", "Q4_K"])
def test_word_formats_through_the_byte_kernels_too(device, fmt):
    from strata.kernels.moe.gemv import byte_config

    n_ff = 256 if fmt == "Q4_K" else 96  # 96 features: not a multiple of the tiles
    stack = synthetic_stack(fmt, fmt, 6, 256, n_ff, seed=4, device=device)
    experts = DecodeExperts.of_stack(stack)
    gen = torch.Generator().manual_seed(5)
    ids, w = routing(2, 3, 6, gen, shared=1)
    x = torch.randn(2, 256, generator=gen)
    h64, y64 = moe_gemv_float64(x, ids, w, _cpu(experts))
    g, d = experts.gate, experts.down
    on_gpu = device == "cuda"  # the interpreter's wide tiles exceed a GPU program's resources
    configs = (byte_config("gate_up", g.spec, g.rows, g.cols, 3, on_gpu),
               byte_config("down", d.spec, d.rows, d.cols, 3, on_gpu))
    assert not any(c.wide for c in configs)
    x, ids, w = x.to(device), ids.to(device), w.to(device)
    assert relative_error(gate_up_swiglu_triton(x, ids, experts, configs[0]), h64) <= ERROR_BOUND
    assert relative_error(moe_gemv_triton(x, ids, w, experts, torch.float32, configs), y64) <= ERROR_BOUND


def test_every_top_k_from_1_to_8(device):
    stack = synthetic_stack("Q4_0", "Q4_0", 12, 64, 32, seed=5, device=device)
    experts = DecodeExperts.of_stack(stack)
    gen = torch.Generator().manual_seed(1)
    for k in range(1, 9):
        ids, w = routing(2, k, 12, gen, shared=k // 2)
        check(torch.randn(2, 64, generator=gen).to(device), ids.to(device), w.to(device), experts)


@pytest.mark.parametrize("fmt", ["Q2_0", "Q4_0"])  # a byte kernel and a word kernel (wide_gemv.py)
def test_slots_through_a_device_table_and_missing_experts_add_nothing(device, fmt):
    stack = synthetic_stack(fmt, fmt, 16, 128, 64, seed=7, device=device)
    gen = torch.Generator().manual_seed(2)
    order = torch.randperm(16, generator=gen)
    slots, table = slots_of(stack, order, 12)  # experts order[12:] are not resident
    cached = DecodeExperts.of_slots(slots, table, stack)
    ids, w = routing(4, 8, 16, gen, shared=4)
    x = torch.randn(4, 128, generator=gen)
    y, _ = check(x.to(device), ids.to(device), w.to(device).to(torch.bfloat16), cached)
    # The definition read from the stacked tensors, with the missing experts' weights zeroed: the slot layout is right.
    resident = torch.isin(ids, order[:12])
    assert not resident.all() and resident.any()
    _, want = moe_gemv_float64(x, ids, w.to(torch.bfloat16) * resident, DecodeExperts.of_stack(_cpu_stack(stack)))
    assert relative_error(y, want) <= ERROR_BOUND


def _cpu_stack(stack):
    from strata.engine.experts import ExpertStack

    return ExpertStack(*(p.to("cpu") for p in (stack.gate, stack.up, stack.down)))


def test_bf16_input_and_output_deterministic_for_eight_tokens(device):
    stack = synthetic_stack("Q4_0", "Q4_0", 16, 64, 64, seed=9, device=device)
    experts = DecodeExperts.of_stack(stack)
    gen = torch.Generator().manual_seed(3)
    ids, w = routing(8, 4, 16, gen, shared=2)
    x = torch.randn(8, 64, generator=gen).to(device, torch.bfloat16)
    ids, w = ids.long().to(device), w.to(device)  # int64 ids (torch.topk's) work as well
    first = moe_gemv(x, ids, w, experts)
    assert first.dtype == torch.bfloat16
    assert torch.equal(first, moe_gemv(x, ids, w, experts))  # no atomics: bit-identical runs
    _, y64 = moe_gemv_float64(x.cpu(), ids.cpu(), w.cpu(), _cpu(experts))
    assert relative_error(first, y64) <= 2 ** -8  # the bf16 output's own rounding


def test_cpu_tensors_take_the_reference():
    stack = synthetic_stack("Q8_0", "Q8_0", 8, 64, 32, seed=11)
    experts = DecodeExperts.of_stack(stack)
    gen = torch.Generator().manual_seed(4)
    ids, w = routing(2, 3, 8, gen)
    x = torch.randn(2, 64, generator=gen)
    assert torch.equal(moe_gemv(x, ids, w, experts), moe_gemv_ref(x, ids, w, experts))


def test_mismatched_or_unsupported_formats_are_named():
    stack = synthetic_stack("Q4_0", "Q4_0", 2, 64, 32)
    from strata.engine.experts import ExpertStack

    bad = ExpertStack(stack.gate, synthetic_stack("Q8_0", "Q8_0", 2, 64, 32).up, stack.down)
    with pytest.raises(StrataError, match="gate and up"):
        DecodeExperts.of_stack(bad)
    with pytest.raises(StrataError, match="Q5_K"):
        DecodeExperts.of_stack(synthetic_stack("Q5_K", "Q5_K", 2, 256, 256))
    with pytest.raises(StrataError, match="slot of 10 bytes"):
        DecodeExperts.of_slots(torch.zeros(4, 10, dtype=torch.uint8), torch.zeros(2, dtype=torch.int32), stack)


# ---- sm_90 builds: the benchmark shapes' launch configurations compile for Hopper and spill nothing

BUILDS = [("Q4_0", 2048, 768, 8), ("Q4_K", 2048, 768, 8), ("Q2_0", 2560, 640, 10), ("IQ2_XS", 2560, 512, 10),
          ("IQ3_XXS", 2560, 512, 10), ("IQ3_S", 2560, 512, 10)]
MATVEC_BUILDS = [("Q4_0", 2048, 4096), ("Q8_0", 4096, 2048), ("Q4_K", 2048, 151936)]  # (format, n_in, n_out)
GATE_UP_SIG = {"x": "*bf16", "ids": "*i32", "slot_of": "*i32", "wg": "*u8", "wu": "*u8", "h": "*fp32",
               "n_ff": "i32", "stride_g": "i32", "stride_u": "i32", "row_bytes": "i32"}
DOWN_SIG = {"h": "*fp32", "ids": "*i32", "topk_w": "*fp32", "slot_of": "*i32", "wd": "*u8", "y": "*fp32",
            "n_out": "i32", "stride_d": "i32", "row_bytes": "i32"}


def _jobs():
    """(label, kernel, signature, constants, config) of every build: the byte kernels on their own tiles (every
    format: the word formats fall back to them at odd offsets), the word kernels on `gemv_config`'s, and the
    streamed kernels on the same tiles (their formats)."""
    from strata.kernels.moe import gemv, stream_gemv, wide_gemv
    from strata.kernels.moe.decode import SPECS

    byte_down_sig = {**{k: v for k, v in DOWN_SIG.items() if k != "n_out"}, "tab": "*i8", "n_embd": "i32"}
    byte_gate_up_sig = {**GATE_UP_SIG, "tab": "*i8"}
    shapes = [(name, "gate_up", n_ff, n_embd, k) for name, n_embd, n_ff, k in BUILDS]
    shapes += [(name, "down", n_embd, n_ff, k) for name, n_embd, n_ff, k in BUILDS]
    shapes += [(name, "matvec", n_out, n_in, 1) for name, n_in, n_out in MATVEC_BUILDS]
    for name, kind, n_out, n_in, top_k in shapes:
        spec = SPECS[name]
        x_type = "*bf16" if kind == "matvec" else "*fp32"
        cfg = gemv.byte_config(kind, spec, n_out, n_in, top_k, True)
        constants = dict(TOP_K=top_k, K=n_in, NB=n_in // spec.block_size, FMT=spec.fmt_id, QK=spec.block_size,
                         TS=spec.type_size, SPLIT16=spec.split16, HAS_MIN=spec.has_min, SLOTS=True, BN=cfg.bn,
                         NS=cfg.ns)
        if kind == "gate_up":
            yield f"bytes {kind}", gemv._gate_up_kernel, byte_gate_up_sig, constants, cfg
        else:
            yield f"bytes {kind}", gemv._down_kernel, {**byte_down_sig, "h": x_type}, {**constants, "KC": cfg.kc}, cfg
        if name not in wide_gemv.WORDS:
            continue
        cfg = gemv.gemv_config(kind, spec, n_out, n_in, top_k, True)
        n_units = n_in // wide_gemv.UNIT[name]
        per = wide_gemv.units_per_slice(n_units * (top_k if kind == "down" else 1), cfg.ns, cfg.split)
        constants = dict(TOP_K=top_k, K=n_in, FMT=spec.fmt_id, N_UNITS=n_units, UNIT_W=wide_gemv.UNIT[name],
                         NT=wide_gemv.WORDS[name], SLOTS=True, BN=cfg.bn, NU=cfg.ns, SPLIT=cfg.split, PER=per)
        tab = {"tab": "*i8" if name in wide_gemv.GRID_FORMATS else "*u8"}  # code_tables, or the weights' stand-in
        if kind == "gate_up":
            signature = {("hid" if k == "h" else k): v for k, v in {**GATE_UP_SIG, **tab}.items()}
            yield f"words {kind}", wide_gemv._word_gate_up_kernel, signature, constants, cfg
        else:
            yield f"words {kind}", wide_gemv._word_down_kernel, {**DOWN_SIG, "h": x_type, **tab}, constants, cfg
        if name not in stream_gemv.STREAM_FORMATS:
            continue
        constants = stream_gemv._constants(spec, n_out, n_in, top_k, True, cfg.bn, cfg.ns)
        shapes_given = ("n_ff", "n_out", "row_bytes")  # compile-time constants of the streamed kernels
        if kind == "gate_up":
            signature = {("hid" if k == "h" else k): v for k, v in {**GATE_UP_SIG, "n_items": "i32"}.items()
                         if k not in shapes_given}
            yield f"stream {kind}", stream_gemv._stream_gate_up_kernel, signature, constants, cfg
        else:
            signature = {k: v for k, v in {**DOWN_SIG, "h": x_type, "n_items": "i32"}.items() if k not in shapes_given}
            yield f"stream {kind}", stream_gemv._stream_down_kernel, signature, constants, cfg


def _build_sm90() -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    for label, kernel, signature, constants, cfg in _jobs():
        # As a launch specializes them: pointers 16-byte aligned, row bytes a multiple of 16 where they are.
        row_bytes = constants["K"] // (constants.get("QK") or 32) * (constants.get("TS") or 18)
        aligned = [n for n, t in signature.items() if t.startswith("*") or (n == "row_bytes" and row_bytes % 16 == 0)]
        attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
        source = ASTSource(kernel, {**signature, **{k: "constexpr" for k in constants}}, constants, attrs=attrs)
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg.warps})
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(compiled.asm["cubin"])
            f.flush()
            usage = subprocess.run([str(cuobjdump), "--dump-resource-usage", f.name], capture_output=True,
                                   text=True).stdout
        regs, stack = re.search(r"REG:(\d+) STACK:(\d+)", usage).groups()
        print(json.dumps({"kernel": label, "FMT": constants["FMT"], "K": constants["K"], "regs": int(regs),
                          "stack": int(stack), "config": [cfg.bn, cfg.ns, cfg.kc, cfg.warps]}), flush=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the tests above compile the kernels themselves")
@needs_ptxas
def test_kernels_build_for_sm90_without_spills():
    from strata.kernels.moe.stream_gemv import STREAM_FORMATS

    builds = builds_of(__file__, timeout=600)
    streamed = sum(name in STREAM_FORMATS for name, *_ in BUILDS) * 2 + sum(name in STREAM_FORMATS
                                                                          for name, *_ in MATVEC_BUILDS)
    assert len(builds) == len(list(_jobs())) == 4 * len(BUILDS) + 2 * len(MATVEC_BUILDS) + streamed  # all have words
    assert not [b for b in builds if b["stack"]], builds


if __name__ == "__main__":
    _build_sm90()


def test_dot_lengths_the_kernels_cannot_step_send_small_models_to_the_reference():
    from strata.kernels.moe.decode import SPECS
    from strata.kernels.moe.stack import dot_length_fits

    # The trained default model's experts have 32 hidden units: its down projection's dot is 32 long.
    assert not dot_length_fits(SPECS["Q8_0"], 32)
    assert dot_length_fits(SPECS["Q8_0"], 64)
    assert not dot_length_fits(SPECS["Q4_K"], 64)  # 256-weight super-blocks
    assert dot_length_fits(SPECS["Q4_K"], 768)
