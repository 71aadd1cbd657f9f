"""The fused path's Q2_0 kernels (`fused_q2_0`) step by step against their float64 references, at small shapes."""

import pytest
import torch
import triton
import triton.language as tl

from strata.bench.moe_prefill import make_layer
from strata.errors import StrataError
from strata.kernels.moe import fused, grouping, quantize32
from strata.kernels.moe.decode import q2_0_codes, q2_0_codes_words
from strata.kernels.moe.quantize32 import dequantize_rows_int8
from strata.kernels.moe.stack import Tiles, tile_config


@triton.jit
def _both_decoders(words, out_bits, out_words, NW: tl.constexpr):
    r = tl.program_id(0) * NW + tl.arange(0, NW)[:, None]
    w = tl.load(words + r * 4 + tl.arange(0, 4)[None, :])
    j = tl.arange(0, 32)[None, :]
    tl.store(out_bits + r * 32 + j, q2_0_codes(w, NW))
    tl.store(out_words + r * 32 + j, q2_0_codes_words(w, NW))


def test_word_decoder_matches_the_code_by_code_one_on_every_word(device):
    # every 16-bit word, each code value in each slot; 64 words a program (a GPU compiles the kernel for real)
    words = torch.arange(65536, dtype=torch.int32, device=device).reshape(16384, 4)
    by_code, by_word = (torch.empty(16384, 32, dtype=torch.int8, device=device) for _ in range(2))
    _both_decoders[(16384 // 64,)](words, by_code, by_word, NW=64)
    assert torch.equal(by_code, by_word)
    assert set(by_word.unique().tolist()) == {-1, 0, 1, 2}


def _layer_and_grouping(device, tile_rows=64):
    layer = make_layer("Q2_0 / Q2_0", 96, n_experts=12, n_embd=128, n_ff=64, top_k=4, seed=7, device=device)
    group = grouping.group_pairs_triton(layer.topk_ids, 12, tile_rows)
    return layer, group, quantize32.quantize_rows_triton(layer.x)


@pytest.mark.parametrize("tiles", [None, Tiles(32, 4, 2, rows=128), Tiles.parse("128x32x4x3hr")])
def test_gate_up_rounds_h_as_the_float64_reference_does(device, tiles):
    layer, group, xq = _layer_and_grouping(device)
    e = layer.experts
    shape = tiles or tile_config("gate_up", e.gate.spec, 64, device == "cuda")  # None: the device's default
    group = grouping.group_pairs_triton(layer.topk_ids, 12, shape.rows)
    hq, hs, _ = fused.gate_up_swiglu_int8_triton(*xq, group, e.gate, e.up, tiles)
    rq, rs, _ = fused.gate_up_swiglu_int8_ref(*(t.cpu() for t in xq), _cpu(group), _cpu_m(e.gate), _cpu_m(e.up))
    used = (group.row_token >= 0).cpu()
    h, ref = dequantize_rows_int8(hq.cpu()[used], hs.cpu()[used]), dequantize_rows_int8(rq[used], rs[used])
    # float32 sums against float64 ones: a code may round the other way at a half step, never further; fp16 x
    # ("h": x's rounded values to 2^-11) also moves a group's scale, by which each of its up to 127 steps moves.
    scale_moved = (hs.cpu()[used].double() - rs[used].double()).abs() / rs[used].double().clamp(min=1e-30)
    assert scale_moved.max() <= (1e-3 if shape.fp16 else 1e-6)
    step = rs[used].double().repeat_interleave(32, dim=1)
    moved = 127 * (hs.cpu()[used].double() - rs[used].double()).abs().repeat_interleave(32, dim=1)
    assert ((h - ref).abs() <= 1.01 * step + moved + 1e-12).all()
    assert (hq.cpu()[used] == rq[used]).float().mean() > (0.98 if shape.fp16 else 0.99)


@pytest.mark.parametrize("tiles", [None, Tiles.parse("128x64x4x3hro")])
def test_down_matches_the_float64_reference(device, tiles):
    layer, group, _ = _layer_and_grouping(device, tiles.rows if tiles else 64)
    h = torch.randn(group.max_rows, 64, device=device)
    hq = quantize32.quantize_rows_triton(h)
    out = fused.down_int8_triton(*hq, group, layer.experts.down, tiles)
    ref = fused.down_int8_ref(*(t.cpu() for t in hq), _cpu(group), _cpu_m(layer.experts.down))
    used = (group.row_token >= 0).cpu()
    err = (out.cpu()[used].double() - ref[used].double()).abs().max() / ref[used].abs().max()
    # float32 accumulation of exact dots (int32 blocks, or fp16 products of exact fp16 values), scaled once per 64
    # values; rows stored as fp16 ("o") round each value to 2^-11 of itself.
    assert err < (2 ** -11 if out.dtype == torch.float16 else 0) + 1e-5


def test_gate_up_tiles_must_hold_whole_groups_of_32_features(device):
    layer, group, xq = _layer_and_grouping(device)
    with pytest.raises(StrataError, match="per 32 features"):
        fused.gate_up_swiglu_int8_triton(*xq, group, layer.experts.gate, layer.experts.up, Tiles(16, 4, 2))


def _cpu(group):
    return grouping.Grouping(group.n_experts, group.top_k, group.max_tiles, *(
        t.cpu() for t in (group.counts, group.starts, group.pair_row, group.row_token, group.tile_expert,
                          group.n_tiles)), group.tile_rows)


def _cpu_m(m):
    return type(m)(m.raw.cpu(), m.qtype, m.rows, m.cols)
