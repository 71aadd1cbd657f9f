"""The fused Q2_0 kernels' variants (`Tiles` letters "m": MMA from a float's bits, "h": fp16 MMAs, "r": half-empty
tiles computed as half tiles) against the default kernels and float64, at small shapes."""

import pytest
import torch
import triton
import triton.language as tl

from strata.bench.moe_prefill import errors, make_layer
from strata.errors import StrataError
from strata.kernels.moe import fused, grouping, quantize32
from strata.kernels.moe.decode import q2_0_codes_words
from strata.kernels.moe.fused_q2_0_fp16 import q2_0_fp16_weights, rounded_fp16
from strata.kernels.moe.prefill import moe_prefill_triton
from strata.kernels.moe.reference import moe_float64
from strata.kernels.moe.stack import Tiles


@triton.jit
def _fp16_and_int8_decoders(words, scales, out_fp16, out_codes, NW: tl.constexpr):
    r = tl.program_id(0) * NW + tl.arange(0, NW)
    w = tl.load(words + r[:, None] * 4 + tl.arange(0, 4)[None, :])
    j = tl.arange(0, 32)[None, :]
    tl.store(out_fp16 + r[:, None] * 32 + j, q2_0_fp16_weights(w, tl.load(scales + r), NW))
    tl.store(out_codes + r[:, None] * 32 + j, q2_0_codes_words(w, NW))


def test_fp16_weights_are_exactly_scale_times_code_minus_one(device):
    # random 16-bit words and each code in every slot (0x0000, 0x5555, 0xAAAA, 0xFFFF); scales from subnormal to
    # large, of both signs
    g = torch.Generator().manual_seed(1)
    words = torch.randint(0, 65536, (512, 4), generator=g, dtype=torch.int32)
    words[:4] = torch.tensor([0x0000, 0x5555, 0xAAAA, 0xFFFF], dtype=torch.int32)[:, None]
    words = words.to(device)
    scales = torch.tensor([3e-7, -2.5e-3, 0.0173, -1.0, 7.5, 1000.0, -6e-5, 0.5], dtype=torch.float16)
    scales = scales.repeat(64).to(device)
    fp16 = torch.empty(512, 32, dtype=torch.float16, device=device)
    codes = torch.empty(512, 32, dtype=torch.int8, device=device)
    _fp16_and_int8_decoders[(512 // 64,)](words, scales, fp16, codes, NW=64)
    exact = codes.double() * scales.double()[:, None]
    assert torch.equal(fp16.double(), exact)


def _layer(device, tile_rows=64):
    layer = make_layer("Q2_0 / Q2_0", 96, n_experts=12, n_embd=128, n_ff=64, top_k=4, seed=7, device=device)
    return layer, grouping.group_pairs_triton(layer.topk_ids, 12, tile_rows)


def _run(layer, tiles):
    return moe_prefill_triton(layer.x, layer.topk_ids, layer.topk_weights, layer.experts, "fused", tiles=tiles)


@pytest.mark.parametrize("shape", ["32x4x2sm/64x4x2m"])  # two 32-value dots, and one block-diagonal 64
def test_magic_conversion_gives_the_default_bytes(device, shape):
    layer, _ = _layer(device)
    base = _run(layer, Tiles.parse(shape.replace("m", "")))
    assert torch.equal(_run(layer, Tiles.parse(shape)), base)


@pytest.mark.parametrize("shape", ["128x32x4x2h/64x4x2h", "32x4x2s/64x4x2"])
def test_half_tiles_give_the_bytes_of_whole_ones(device, shape):
    tiles = Tiles.parse(shape)
    layer, group = _layer(device, tiles.rows)
    counts = group.counts.cpu()
    tail = counts % tiles.rows
    assert ((tail > 0) & (tail <= tiles.rows // 2)).any() and (tail > tiles.rows // 2).any()  # both kinds of tile
    half = Tiles.parse(shape.replace("/", "r/") + "r")
    assert half.half and half.down.half and str(half) == shape.replace("/", "r/") + "r"
    assert torch.equal(_run(layer, half), _run(layer, tiles))


def test_rounded_fp16_is_code_times_scale_rounded_once(device):
    x = torch.randn(40, 96, device=device) * torch.logspace(-3, 3, 40, device=device)[:, None]
    codes, scales, _ = quantize32.quantize_rows_triton(x)
    ref = quantize32.dequantize_rows_int8(codes.cpu(), scales.cpu()).half()
    assert torch.equal(rounded_fp16(codes, scales).cpu(), ref)
    assert torch.equal(rounded_fp16(codes.cpu(), scales.cpu()), ref)  # the torch form


# fp16 both; int8 gate/up writing fp16 H; 128 rows, two blocks a step, fp16 gate/up writing int8 H; fp16 both with
# the down rows stored as fp16
@pytest.mark.parametrize("shape", ["32x4x2h/64x4x2h", "32x4x2s/64x4x2h", "128x32x4x2hw/128x64x4x2s",
                                   "32x4x2h/64x4x2ho"])
def test_fp16_shapes_stay_within_the_bounds_of_the_int8_ones(device, shape):
    tiles = Tiles.parse(shape)
    layer, _ = _layer(device, tiles.rows)
    refs = moe_float64(layer.x.cpu(), layer.topk_ids.cpu(), layer.topk_weights.cpu(),
                       _cpu_experts(layer.experts), roundings=(None, "int8"))
    out = _run(layer, tiles).cpu()
    base = _run(layer, None).cpu()
    # Against float64 with the same int8 rounding of x and H: fp16 x (2^-12 rms) moves g and u by ~2e-4, which
    # turns ~1 % of H's codes the other way (one code step each), ~1.3e-3 rms; the tool's bounds are 2e-3 / 3e-2.
    # fp16 H alone (the down kernel's) stays near its 2^-12.
    rms, worst = errors(out, refs["int8"])
    assert rms < 2e-3 and worst < 3e-2, (rms, worst)
    if not tiles.fp16:
        assert rms < 3e-4, rms
    (f_rms, f_worst), (b_rms, b_worst) = errors(out, refs[None]), errors(base, refs[None])
    assert f_rms <= 1.05 * b_rms and f_worst <= 1.5 * b_worst  # as close to exact as the int8 kernels
    assert (out[layer.zero_token] == 0).all()


def test_fp16_h_cannot_reach_an_int8_down_kernel(device):
    layer, group = _layer(device)
    h = torch.zeros(group.max_rows, 64, dtype=torch.float16, device=device)
    scales = torch.zeros(group.max_rows, 2, device=device)
    with pytest.raises(StrataError, match="int8 codes"):
        fused.down_int8_triton(h, scales, scales, group, layer.experts.down, Tiles(64, 4, 2))


def test_shape_letters():
    t = Tiles.parse("128x32x4x2h/128x64x4x2sm")
    assert t.fp16 and not t.down.fp16 and t.down.split and t.down.magic and not t.same_bytes
    assert str(t) == "128x32x4x2h/64x4x2sm" and Tiles.parse("32x4x2sm").same_bytes
    with pytest.raises(StrataError, match="fp16 variant"):
        Tiles.parse("32x4x2hs")
    with pytest.raises(StrataError, match="form of the fp16"):
        Tiles.parse("32x4x2sw")
    assert Tiles.parse("32x4x2hw").wide and str(Tiles.parse("32x4x2hw")) == "32x4x2hw"
    rows16 = Tiles.parse("32x4x2h/64x4x2ho")
    assert rows16.down.fp16_out and not rows16.fp16_out and not rows16.same_bytes and str(rows16) == "32x4x2h/64x4x2ho"
    assert not Tiles.parse("32x4x2s/64x4x2o").same_bytes


def _cpu_experts(e):
    from strata.kernels.moe.prefill import PromptExperts
    return PromptExperts(*(type(m)(m.raw.cpu(), m.qtype, m.rows, m.cols) for m in (e.gate, e.up, e.down)))


def test_an_fp16_shape_keeps_int8_h_for_a_down_projection_of_another_format(device):
    # Q2_0 gate/up (fp16 kernel) before IQ4_NL down experts (the int8 matmul): H stays int8 codes for it
    layer = make_layer("Q2_0 / IQ4_NL", 64, n_experts=12, n_embd=128, n_ff=64, top_k=4, seed=5, device=device)
    out, base = _run(layer, Tiles.parse("32x4x2h/64x4x2h")), _run(layer, None)
    rms, worst = errors(out.cpu(), base.cpu())
    assert rms < 3e-3 and worst < 3e-2 and (out[layer.zero_token] == 0).all()


def test_an_fp16_down_shape_takes_int8_h_from_a_gate_up_of_another_format(device):
    # IQ4_XS gate/up (the generic int8 kernel writes H's codes) before Q2_0 down experts under an fp16 shape
    layer = make_layer("IQ4_XS / Q2_0", 32, n_experts=12, n_embd=256, n_ff=64, top_k=4, seed=5, device=device)
    out, base = _run(layer, Tiles.parse("32x4x2/64x4x2h")), _run(layer, None)
    rms, worst = errors(out.cpu(), base.cpu())
    assert rms < 1e-3 and worst < 1e-2 and (out[layer.zero_token] == 0).all()
