"""The decode expert kernels (gate/up + SwiGLU, weighted down sum) against float64 on the dequantized weights.

Bound: max |kernel - float64| <= ERROR_BOUND (1e-5) * max |float64|, for H and for the output (float32 summation
is the only error: measured ~2e-7). Run as a script, this file builds the kernels for sm_90 (see the last test).
"""

import json
import os
import re
import subprocess
import sys
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

ROOT = Path(__file__).resolve().parents[3]


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


def test_every_top_k_from_1_to_8(device):
    stack = synthetic_stack("Q4_0", "Q4_0", 12, 64, 32, seed=5, device=device)
    experts = DecodeExperts.of_stack(stack)
    gen = torch.Generator().manual_seed(1)
    for k in range(1, 9):
        ids, w = routing(2, k, 12, gen, shared=k // 2)
        check(torch.randn(2, 64, generator=gen).to(device), ids.to(device), w.to(device), experts)


def test_slots_through_a_device_table_and_missing_experts_add_nothing(device):
    stack = synthetic_stack("Q2_0", "Q2_0", 16, 128, 64, seed=7, device=device)
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

BUILDS = [("Q4_0", 2048, 768, 8), ("Q4_K", 2048, 768, 8), ("Q2_0", 2560, 640, 10), ("IQ2_XS", 2560, 512, 10)]


def _build_sm90() -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from strata.kernels.moe import gemv
    from strata.kernels.moe.decode import SPECS

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    common = {"ids": "*i32", "slot_of": "*i32", "tab": "*i8"}
    for name, n_embd, n_ff, top_k in BUILDS:
        spec = SPECS[name]
        for kind, kernel, n_out, n_in, signature in [
            ("gate_up", gemv._gate_up_kernel, n_ff, n_embd,
             {"x": "*bf16", **common, "wg": "*u8", "wu": "*u8", "h": "*fp32", "n_ff": "i32", "stride_g": "i32",
              "stride_u": "i32", "row_bytes": "i32"}),
            ("down", gemv._down_kernel, n_embd, n_ff,
             {"h": "*fp32", "ids": "*i32", "topk_w": "*fp32", "slot_of": "*i32", "wd": "*u8", "tab": "*i8",
              "y": "*fp32", "n_embd": "i32", "stride_d": "i32", "row_bytes": "i32"})]:
            cfg = gemv.gemv_config(kind, spec, n_out, n_in, top_k, True)
            constants = dict(TOP_K=top_k, K=n_in, NB=n_in // spec.block_size, FMT=spec.fmt_id, QK=spec.block_size,
                             TS=spec.type_size, SPLIT16=spec.split16, HAS_MIN=spec.has_min, SLOTS=True,
                             BN=cfg.bn, NS=cfg.ns, **({"KC": cfg.kc} if kind == "down" else {}))
            source = ASTSource(kernel, {**signature, **{k: "constexpr" for k in constants}}, constants)
            compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg.warps})
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(compiled.asm["cubin"])
                f.flush()
                usage = subprocess.run([str(cuobjdump), "--dump-resource-usage", f.name], capture_output=True,
                                       text=True).stdout
            regs, stack = re.search(r"REG:(\d+) STACK:(\d+)", usage).groups()
            print(json.dumps({"format": name, "kernel": kind, "regs": int(regs), "stack": int(stack),
                              "config": [cfg.bn, cfg.ns, cfg.kc, cfg.warps]}), flush=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the tests above compile the kernels themselves")
@pytest.mark.skipif(not (Path(__import__("triton").__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists(),
                    reason="this Triton build carries no ptxas")
def test_kernels_build_for_sm90_without_spills():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    run = subprocess.run([sys.executable, __file__], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    builds = [json.loads(line) for line in run.stdout.splitlines()]
    assert len(builds) == 2 * len(BUILDS)
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
