"""Experts of 32 hidden units (the trained default model: Q8_0, 256 inputs, 32 experts, top 4) through the decode
GEMV kernels: their down projection's dot is one 32-weight unit long, which the prompt kernels cannot step but the
GEMVs can. Checked against float64 on the dequantized weights within gemv.ERROR_BOUND (1e-5 of max |y|), with the
tiles a GPU would launch and with the interpreter's, resident and through cache slots; and `kernel_path` sends
decode steps (not prompt chunks) of such experts to the GEMVs, so the default model's decode can be captured."""

from types import SimpleNamespace

import pytest
import torch

from strata.bench.moe_decode import routing, slots_of, synthetic_stack
from strata.engine.experts import PROMPT_KERNEL_MIN_TOKENS, kernel_path
from strata.kernels.moe.gemv import (ERROR_BOUND, DecodeExperts, gate_up_swiglu_triton, gemv_config,
                                     moe_gemv_float64, moe_gemv_triton, relative_error)

N_EMBD, WIDTH, N_EXPERTS, TOP_K = 256, 32, 32, 4  # the default model's expert shape


@pytest.fixture(scope="module")
def stack(device):
    return synthetic_stack("Q8_0", "Q8_0", N_EXPERTS, N_EMBD, WIDTH, seed=11, device=device)


def _cpu(experts: DecodeExperts) -> DecodeExperts:
    parts = [type(m)(m.raw.cpu(), m.qtype, m.rows, m.cols, m.stride) for m in (experts.gate, experts.up, experts.down)]
    return DecodeExperts(*parts, slot_of=None if experts.slot_of is None else experts.slot_of.cpu())


def _gpu_configs(experts: DecodeExperts):
    """The tiles a GPU launch picks at this shape (word kernels, a unit of 32 weights), run here by the interpreter."""
    g, d = experts.gate, experts.down
    return (gemv_config("gate_up", g.spec, g.rows, g.cols, TOP_K, True),
            gemv_config("down", d.spec, d.rows, d.cols, TOP_K, True))


# A verify window with the GPU's tiles (slow under the interpreter: one case), a step and a window with its own.
@pytest.mark.parametrize("tiles, n_tokens", [("gpu", 2), ("interpreter", 1), ("interpreter", 3)])
def test_width_32_experts_against_float64(device, stack, tiles, n_tokens):
    experts = DecodeExperts.of_stack(stack)
    configs = _gpu_configs(experts) if tiles == "gpu" else (None, None)
    if tiles == "gpu":
        assert all(c.wide for c in configs)  # Q8_0 takes the word kernels, whose 32-weight unit is the whole dot
    gen = torch.Generator().manual_seed(n_tokens)
    ids, w = routing(n_tokens, TOP_K, N_EXPERTS, gen, shared=min(2, n_tokens - 1))
    x = torch.randn(n_tokens, N_EMBD, generator=gen)
    h64, y64 = moe_gemv_float64(x, ids, w, _cpu(experts))
    x, ids, w = x.to(device), ids.to(device), w.to(device)
    assert relative_error(gate_up_swiglu_triton(x, ids, experts, configs[0]), h64) <= ERROR_BOUND
    y = moe_gemv_triton(x, ids, w, experts, torch.float32, configs)
    assert relative_error(y, y64) <= ERROR_BOUND


def test_width_32_experts_through_slots_with_misses(device, stack):
    gen = torch.Generator().manual_seed(5)
    order = torch.randperm(N_EXPERTS, generator=gen)
    slots, table = slots_of(stack, order, 20)  # experts order[20:] are not resident: they add exactly nothing
    cached = DecodeExperts.of_slots(slots, table, stack)
    ids, w = routing(2, TOP_K, N_EXPERTS, gen, shared=1)
    x = torch.randn(2, N_EMBD, generator=gen)
    resident = torch.isin(ids, order[:20])
    assert resident.any() and not resident.all()
    cpu_stack = synthetic_stack("Q8_0", "Q8_0", N_EXPERTS, N_EMBD, WIDTH, seed=11)
    _, want = moe_gemv_float64(x, ids, w * resident, DecodeExperts.of_stack(cpu_stack))
    y = moe_gemv_triton(x.to(device), ids.to(device), w.to(device), cached, torch.float32)
    assert relative_error(y, want) <= ERROR_BOUND


def _on_gpu(rows: int, dtype=torch.bfloat16):
    """What kernel_path reads of a step's activations, as a CUDA tensor would show it (no GPU here)."""
    return SimpleNamespace(is_cuda=True, dtype=dtype, shape=(rows, N_EMBD))


def test_kernel_path_sends_width_32_decode_steps_to_the_gemv_and_prompts_to_the_loop(stack):
    cpu_stack = synthetic_stack("Q8_0", "Q8_0", N_EXPERTS, N_EMBD, WIDTH, seed=11)
    for rows in (1, 2, 4, PROMPT_KERNEL_MIN_TOKENS - 1):
        assert kernel_path(cpu_stack, _on_gpu(rows)) == "decode"
    assert kernel_path(cpu_stack, _on_gpu(PROMPT_KERNEL_MIN_TOKENS)) is None  # the grouped GEMMs step 64 values
    assert kernel_path(cpu_stack, _on_gpu(1, torch.float32)) is None
    wider = synthetic_stack("Q8_0", "Q8_0", 4, N_EMBD, 64, seed=1)
    assert kernel_path(wider, _on_gpu(PROMPT_KERNEL_MIN_TOKENS)) == "prompt"
    assert kernel_path(wider, _on_gpu(1)) == "decode"


def test_gemv_dot_lengths_are_whole_units_of_whole_blocks():
    from strata.kernels.moe.decode import SPECS
    from strata.kernels.moe.stack import dot_length_fits, gemv_length_fits

    assert gemv_length_fits(SPECS["Q8_0"], 32) and not dot_length_fits(SPECS["Q8_0"], 32)
    assert not gemv_length_fits(SPECS["Q8_0"], 48)
    assert not gemv_length_fits(SPECS["Q4_K"], 64)  # 256-weight super-blocks
    assert gemv_length_fits(SPECS["Q4_K"], 768)
