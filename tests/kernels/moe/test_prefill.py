"""The three prompt expert paths, as Triton kernels, against float64 with Strata's bounds (prefill_fused_*_test)."""

import pytest
import torch

from strata import switches
from strata.bench.moe_prefill import (DENSE_RMS, DENSE_WORST, FUSED_RMS_VS_MMQ, FUSED_WORST_VS_MMQ, ROUNDED_RMS,
                                      ROUNDED_WORST, errors, make_layer)
from strata.kernels.moe.prefill import moe_prefill, moe_prefill_ref, moe_prefill_triton, prompt_expert_path
from strata.kernels.moe.reference import moe_float64
from strata.kernels.moe.stack import Tiles
from strata.models.weights import QuantWeight


def run_paths(layer, paths):
    refs = moe_float64(layer.x.cpu(), layer.topk_ids.cpu(), layer.topk_weights.cpu(), _cpu(layer.experts),
                       roundings=(None, "int8", "fp16"))
    outs = {p: moe_prefill_triton(layer.x, layer.topk_ids, layer.topk_weights, layer.experts, p).cpu() for p in paths}
    for path, out in outs.items():
        assert (out[layer.zero_token] == 0).all(), path  # exactly zero, not merely small
        rms, worst = errors(out, refs["fp16" if path == "dense" else "int8"])
        if path == "dense":
            assert rms <= DENSE_RMS and worst <= DENSE_WORST, (path, rms, worst)
        else:
            assert rms <= ROUNDED_RMS and worst <= ROUNDED_WORST, (path, rms, worst)
        rms, worst = errors(out, refs[None])
        assert rms <= 0.03 and worst <= 0.25, (path, rms, worst)  # Strata's bound where no MMQ path runs
    if "fused" in outs:
        (m_rms, m_worst), (f_rms, f_worst) = errors(outs["mmq"], refs[None]), errors(outs["fused"], refs[None])
        assert f_rms <= FUSED_RMS_VS_MMQ * m_rms and f_worst <= FUSED_WORST_VS_MMQ * m_worst
        rms, worst = errors(outs["fused"], outs["mmq"])
        # Each within ROUNDED_RMS of the same rounded reference; a GPU's fused shapes are fp16 ones ("h"), whose x
        # and H in fp16 put them ~1e-3 from mmq at this small N (int8 shapes: ~1e-6).
        assert rms <= ROUNDED_RMS and worst <= 2e-2
    return outs, refs


def _cpu(experts):
    from strata.kernels.moe.prefill import PromptExperts
    from strata.kernels.moe.stack import ExpertMatrix

    return PromptExperts(*(ExpertMatrix(m.raw.cpu(), m.qtype, m.rows, m.cols)
                           for m in (experts.gate, experts.up, experts.down)))


def test_q2_0_all_paths_meet_strata_bounds(device):
    layer = make_layer("Q2_0 / Q2_0", 256, n_experts=64, n_embd=128, n_ff=64, device=device)
    outs, refs = run_paths(layer, ["dense", "mmq", "fused"])
    # The int8 paths' error is the int8 rounding's own: about 1e-2 of the output, as in Strata's tables.
    assert 3e-3 < errors(outs["mmq"], refs[None])[0] < 3e-2


@pytest.mark.parametrize("pair", ["IQ2_XS / Q2_0", "IQ3_XXS / Q2_0", "IQ3_S / Q2_0", "IQ4_XS / IQ4_NL", "Q4_K / Q2_0"])
def test_native_packs_int8_paths_meet_strata_bounds(device, pair):
    layer = make_layer(pair, 64, n_experts=16, n_embd=256, n_ff=64, top_k=6, seed=1, device=device)
    run_paths(layer, ["mmq", "fused"])


def test_dense_path_decodes_offsets_and_per_16_scales(device):
    layer = make_layer("Q4_K / IQ4_NL", 64, n_experts=16, n_embd=256, n_ff=64, top_k=4, seed=2, device=device)
    run_paths(layer, ["dense"])
    layer = make_layer("IQ2_XS / Q2_0", 64, n_experts=16, n_embd=256, n_ff=64, top_k=4, seed=3, device=device)
    run_paths(layer, ["dense"])


def small_layer(device, dtype=torch.float32):
    layer = make_layer("Q2_0 / Q2_0", 64, n_experts=16, n_embd=64, n_ff=64, top_k=4, seed=4, device=device)
    layer.x = layer.x.to(dtype)
    return layer


def test_unset_switches_keep_the_default_path_and_its_bytes(device):
    assert prompt_expert_path() == "mmq"
    layer = small_layer(device)
    args = (layer.x, layer.topk_ids, layer.topk_weights, layer.experts)
    default = moe_prefill_triton(*args)
    assert torch.equal(default, moe_prefill_triton(*args, path="mmq"))
    assert torch.equal(default, moe_prefill_triton(*args))  # run to run: the atomic placement does not leak out
    with switches.override(STRATA_PF_FUSED=False, STRATA_PREFILL_MMQ=True):
        assert torch.equal(default, moe_prefill_triton(*args))
    with switches.override(STRATA_PF_FUSED=True):
        assert prompt_expert_path() == "fused"
        fused = moe_prefill_triton(*args)
        assert torch.equal(fused, moe_prefill_triton(*args, path="fused")) and not torch.equal(fused, default)
    with switches.override(STRATA_PREFILL_MMQ=False):
        assert prompt_expert_path() == "dense"
    with switches.override(STRATA_PREFILL_MMQ=False, STRATA_PF_FUSED=True):
        assert prompt_expert_path() == "dense"  # the float path wins: it is the reference
    assert prompt_expert_path() == "mmq"


def test_bf16_activations_give_bf16_output(device):
    layer = small_layer(device, torch.bfloat16)
    y = moe_prefill_triton(layer.x, layer.topk_ids, layer.topk_weights, layer.experts, "fused")
    ref = moe_float64(layer.x, layer.topk_ids, layer.topk_weights, layer.experts, roundings=("int8",))["int8"]
    assert y.dtype == torch.bfloat16 and errors(y, ref)[0] < 5e-3


def test_cpu_dispatch_runs_the_references_and_takes_engine_stacks():
    layer = small_layer("cpu")
    e = layer.experts
    stack = type("Stack", (), {})()  # the engine's ExpertStack shape: QuantWeights with raw, ggml_type, shape
    for name, m in (("gate", e.gate), ("up", e.up), ("down", e.down)):
        setattr(stack, name, QuantWeight(name, m.qtype, (m.n_experts, m.rows, m.cols), m.raw.reshape(m.n_experts, -1)))
    args = (layer.x, layer.topk_ids, layer.topk_weights)
    for path in ("dense", "mmq", "fused"):
        y = moe_prefill(*args, stack, path)
        assert torch.equal(y, moe_prefill_ref(*args, e, path))
        ref = moe_float64(*args, e, roundings=("fp16" if path == "dense" else "int8",))
        assert errors(y, next(iter(ref.values())))[0] < 1e-5


def test_launch_shapes_give_the_same_bytes(device):
    """Rows per tile, BN, warps and stages change which program computes an output, never its arithmetic."""
    layer = make_layer("Q2_0 / Q2_0", 24, n_experts=10, n_embd=128, n_ff=64, top_k=3, seed=5, device=device)
    args = (layer.x, layer.topk_ids, layer.topk_weights, layer.experts)
    for path in ("mmq", "fused"):
        base = moe_prefill_triton(*args, path, tiles=Tiles(32, 4, 2))
        assert torch.equal(base, moe_prefill_triton(*args, path, tiles=Tiles(64, 8, 2, rows=128))), path
        default = moe_prefill_triton(*args, path)
        if path == "mmq" or device == "cpu":
            assert torch.equal(default, base), path
        else:  # a GPU's fused default is an fp16 shape ("h"): other roundings, within the rounded bound of int8's
            assert errors(default.cpu(), base.cpu())[0] <= ROUNDED_RMS
    # The fused Q2_0 kernels: two 32-value dots a step instead of one block-diagonal 64, gate/up and down shapes apart.
    split = Tiles(32, 4, 2, down=Tiles(64, 4, 2, split=True), split=True)
    assert torch.equal(base, moe_prefill_triton(*args, "fused", tiles=split))


def test_fused_q2_0_chunks_of_few_rows_an_expert_take_the_small_tiles():
    from types import SimpleNamespace

    from strata.kernels.moe.prefill import FUSED_Q2_0_SMALL, SMALL_CHUNK_ROWS, small_chunk_tiles

    def experts(fmt):
        return SimpleNamespace(gate=SimpleNamespace(spec=SimpleNamespace(scale_per_64=fmt == "Q2_0")))

    assert FUSED_Q2_0_SMALL.rows == 64 and FUSED_Q2_0_SMALL.fp16 and FUSED_Q2_0_SMALL.down.fp16
    assert small_chunk_tiles(experts("Q2_0"), 2048 * 10, 512) is FUSED_Q2_0_SMALL  # 40 rows an expert
    assert small_chunk_tiles(experts("Q2_0"), SMALL_CHUNK_ROWS * 512, 512) is None  # from there the defaults
    assert small_chunk_tiles(experts("Q2_0"), 16384 * 10, 512) is None
    assert small_chunk_tiles(experts("IQ2_XS"), 2048 * 10, 512) is None  # measured for Q2_0 only
