"""The fused Q2_0 kernels' register-operand variants ("a" from int8 codes, "r" from fp16 rows, "t" the weights:
`fused_q2_0_regs`): their fp16 values bit for bit against `rounded_fp16` in the operand's row and k order, the
k-permuted copies, and the path under their shapes against "h" and the float64 bounds."""

import pytest
import torch
import triton
import triton.language as tl

from strata.bench.moe_prefill import errors, make_layer
from strata.errors import StrataError
from strata.kernels.moe import fused, grouping
from strata.kernels.moe.fused_q2_0_fp16 import rounded_fp16
from strata.kernels.moe.fused_q2_0_regs import (codes_operand, fp16_rows_operand, load_codes, load_fp16_rows,
                                                operand_k_positions, operand_rows)
from strata.kernels.moe.prefill import moe_prefill_triton
from strata.kernels.moe.reference import moe_float64
from strata.kernels.moe.stack import Tiles


@triton.jit
def _operand_values(codes, scales, n_real, out, K: tl.constexpr, BM: tl.constexpr, WARPS: tl.constexpr,
                    ASM: tl.constexpr):
    rows = operand_rows(BM, WARPS)
    real = rows < n_real
    k0 = tl.program_id(0) * 64
    words, s = load_codes(codes, scales, tl.where(real, rows, 0).to(tl.int64), real, k0, K, ASM)
    x = codes_operand(words, s, BM, WARPS, ASM)
    tl.store(out + tl.arange(0, BM)[:, None] * K + k0 + tl.arange(0, 64)[None, :], x)


@triton.jit
def _operand_rows_values(x, n_real, out, K: tl.constexpr, BM: tl.constexpr, WARPS: tl.constexpr):
    rows = operand_rows(BM, WARPS)
    real = rows < n_real
    k0 = tl.program_id(0) * 64
    words0, words1 = load_fp16_rows(x, tl.where(real, rows, 0).to(tl.int64), real, k0, K)
    tl.store(out + tl.arange(0, BM)[:, None] * K + k0 + tl.arange(0, 64)[None, :],
             fp16_rows_operand(words0, words1, BM, WARPS))


def _memory_k(halves=False):
    """For each k of the operand's step order, the position in memory it reads (operand_k's permutation, or
    operand_k_halves' in each 32-value half)."""
    k = torch.arange(64)
    if halves:
        half, c, h, t, e = k // 32, (k // 16) % 2, (k // 8) % 2, (k // 2) % 4, k % 2
        return 32 * half + 8 * t + 4 * c + 2 * h + e
    c, h, t, e = k // 16, (k // 8) % 2, (k // 2) % 4, k % 2
    return 16 * t + 4 * c + 2 * h + e


@pytest.mark.parametrize("rows,warps", [(64, 4), (128, 8)])
def test_operand_values_are_rounded_fp16_bit_for_bit(device, rows, warps):
    # every code (-128 too), scales from fp16-subnormal products to overflow, 6 padding rows that must read 0
    g = torch.Generator().manual_seed(3)
    k = 128
    codes = torch.randint(-128, 128, (rows, k), generator=g, dtype=torch.int8)
    codes[0, :] = torch.arange(-128, 0, dtype=torch.int8)
    codes[1, :] = torch.arange(0, 128, dtype=torch.int8)
    scales = torch.exp(torch.empty(rows, k // 32).uniform_(-20, 7, generator=g))
    scales[2] = torch.tensor([1e-9, 3e-6, 600.0, 1.0])  # fp16 subnormals and products beyond 65504 (inf)
    n_real = rows - 6
    out = torch.empty(rows, k, dtype=torch.float16, device=device)
    _operand_values[(k // 64,)](codes.to(device), scales.to(device), n_real, out, K=k, BM=rows, WARPS=warps,
                                ASM=device == "cuda")
    exact = rounded_fp16(codes, scales)
    exact[n_real:] = 0
    got = out.cpu().reshape(rows, k // 64, 64)[:, :, torch.argsort(_memory_k())].reshape(rows, k)
    assert torch.equal(got.view(torch.int16), exact.view(torch.int16))  # bits: -0, inf and subnormals alike


@pytest.mark.parametrize("rows,warps", [(64, 4), (128, 8)])
def test_fp16_rows_reach_the_operand_unchanged(device, rows, warps):
    g = torch.Generator().manual_seed(4)
    k = 128
    x = torch.randn(rows, k, generator=g).half()
    x[0, :8] = torch.tensor([float("inf"), -0.0, 6e-8, -65504, 1, -1, 0.5, 2]).half()
    n_real = rows - 5
    out = torch.empty(rows, k, dtype=torch.float16, device=device)
    _operand_rows_values[(k // 64,)](x.to(device), n_real, out, K=k, BM=rows, WARPS=warps)
    exact = x.clone()
    exact[n_real:] = 0
    got = out.cpu().reshape(rows, k // 64, 64)[:, :, torch.argsort(_memory_k(halves=True))].reshape(rows, k)
    assert torch.equal(got.view(torch.int16), exact.view(torch.int16))


def test_permuted_copy_puts_each_value_at_its_operand_position(device):
    # the "t" kernels' x copy: rounded_fp16's values, each row's value m at operand_k_position(m), which keeps each
    # 32-value group in place (k 16c + 8h + 2t + e reads memory 8t + 4c + 2h + e), Triton and torch forms alike
    g = torch.Generator().manual_seed(5)
    codes = torch.randint(-127, 128, (40, 128), generator=g, dtype=torch.int8)
    scales = torch.rand(40, 4, generator=g) * 0.1
    position = operand_k_positions(128)
    assert sorted(position.tolist()) == list(range(128)) and (position // 32 == torch.arange(128) // 32).all()
    assert position[:32].tolist()[:10] == [0, 1, 8, 9, 16, 17, 24, 25, 2, 3]
    natural = rounded_fp16(codes, scales)
    permuted = rounded_fp16(codes.to(device), scales.to(device), permuted=True).cpu()
    assert torch.equal(permuted[:, position], natural)
    assert torch.equal(rounded_fp16(codes, scales, permuted=True), permuted)


def _layer(device, tile_rows):
    layer = make_layer("Q2_0 / Q2_0", 96, n_experts=12, n_embd=128, n_ff=64, top_k=4, seed=7, device=device)
    return layer, grouping.group_pairs_triton(layer.topk_ids, 12, tile_rows)


def _run(layer, tiles):
    return moe_prefill_triton(layer.x, layer.topk_ids, layer.topk_weights, layer.experts, "fused", tiles=tiles)


# both kernels; 8 warps (two warpgroups); gate/up only (int8 H into an "h" down); down only (an "h" gate/up
# writing int8 H for it); fp16 rows ("r") in both, and beside "a"; the weights ("t") in both (8 warps), gate/up
# only, down only (H written k-permuted for it)
@pytest.mark.parametrize("shape", ["128x32x4x2ha/64x4x2ha", "128x32x8x2ha/128x64x8x2ha", "128x32x4x2ha/64x4x2h",
                                   "128x32x4x2h/64x4x2ha", "128x32x8x2hr/128x64x8x2hr", "128x32x4x2ha/64x4x2hr",
                                   "128x64x8x2ht/128x128x8x2ht", "128x32x4x2ht/64x4x2h", "128x32x4x2hr/64x4x2ht"])
def test_register_operand_shapes_match_h_up_to_summation_order(device, shape):
    tiles = Tiles.parse(shape)
    layer, _ = _layer(device, tiles.rows)
    out = _run(layer, tiles).cpu()
    h = _run(layer, Tiles.parse(shape.replace("a", "").replace("r", "").replace("t", ""))).cpu()
    # The same products as "h", summed in another k order (float32): far below fp16 x's own 2^-12.
    rms, worst = errors(out, h)
    assert rms < 1e-4 and worst < 1e-3, (rms, worst)
    refs = moe_float64(layer.x.cpu(), layer.topk_ids.cpu(), layer.topk_weights.cpu(), _cpu_experts(layer.experts),
                       roundings=(None, "int8"))
    rms, worst = errors(out, refs["int8"])
    assert rms < 2e-3 and worst < 3e-2, (rms, worst)  # the tool's bounds for the int8 paths
    assert (out[layer.zero_token] == 0).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the wgmma pipeline of a compiled kernel")
@pytest.mark.parametrize("shape", ["128x32x4x3ht/64x4x3ht", "128x64x8x3ht/128x128x8x3ht"])
def test_weights_operand_at_the_layers_dot_lengths_on_the_gpu(shape):
    # "t" keeps its wgmmas in flight across steps with their register operands rewritten each step (Triton waits
    # for each one's previous instance): at the layer's N = 2560 and FF = 640 (40 and 10 steps) a stale or clobbered
    # operand would show against "h" far above the summation order's ~1e-6
    layer = make_layer("Q2_0 / Q2_0", 512, n_experts=16, n_embd=2560, n_ff=640, top_k=4, seed=8, device="cuda")
    out, h = _run(layer, Tiles.parse(shape)), _run(layer, Tiles.parse(shape.replace("t", "")))
    rms, worst = errors(out.cpu(), h.cpu())
    assert rms < 1e-4 and worst < 1e-3, (rms, worst)


def _cpu_experts(e):
    from strata.kernels.moe.prefill import PromptExperts
    return PromptExperts(*(type(m)(m.raw.cpu(), m.qtype, m.rows, m.cols) for m in (e.gate, e.up, e.down)))


def test_weights_operand_down_takes_int8_h_through_a_permuted_copy(device):
    # int8 H (another format's gate/up, the reference's) reaches a "t" down kernel as rounded_fp16's k-permuted copy
    layer, group = _layer(device, 128)
    g = torch.Generator().manual_seed(6)
    codes = torch.randint(-127, 128, (group.max_rows, 64), generator=g, dtype=torch.int8).to(device)
    scales = (torch.rand(group.max_rows, 2, generator=g) * 0.01).to(device)
    out = fused.down_int8_triton(codes, scales, scales, group, layer.experts.down, Tiles.parse("128x64x4x2ht"))
    base = fused.down_int8_triton(codes, scales, scales, group, layer.experts.down, Tiles.parse("128x64x4x2h"))
    real = (group.row_token >= 0).cpu()
    rms, worst = errors(out.cpu()[real], base.cpu()[real])
    assert rms < 1e-5 and worst < 1e-4, (rms, worst)


def test_register_operand_down_needs_int8_h(device):
    layer, group = _layer(device, 128)
    h = torch.zeros(group.max_rows, 64, dtype=torch.float16, device=device)
    scales = torch.zeros(group.max_rows, 2, device=device)
    with pytest.raises(StrataError, match="int8 codes"):
        fused.down_int8_triton(h, scales, scales, group, layer.experts.down, Tiles.parse("128x64x4x2ha"))
    codes = torch.zeros(group.max_rows * 64 + 1, dtype=torch.int8, device=device)[1:].view(group.max_rows, 64)
    with pytest.raises(StrataError, match="16-byte aligned"):
        fused.down_int8_triton(codes, scales, scales, group, layer.experts.down, Tiles.parse("128x64x4x2ha"))


def test_register_operand_letter():
    t = Tiles.parse("128x32x4x3ha/64x4x3ha")
    assert t.codes and t.down.codes and t.fp16 and not t.same_bytes and str(t) == "128x32x4x3ha/64x4x3ha"
    assert not Tiles.parse("128x32x4x3h/64x4x3ha").codes and not Tiles.parse("128x32x4x3h").codes
    with pytest.raises(StrataError, match="register operand .a, r, t. is a form of the fp16"):
        Tiles.parse("128x32x4x3a")
    with pytest.raises(StrataError, match="not two"):
        Tiles.parse("128x32x4x3hwa")
    with pytest.raises(StrataError, match="one of them"):
        Tiles.parse("128x32x4x3har")
    with pytest.raises(StrataError, match="one of them"):
        Tiles.parse("128x32x4x3hta")
    with pytest.raises(StrataError, match="16 weight rows a warp"):
        Tiles.parse("128x32x8x3ht")  # 64 weight rows (gate and up) for 8 warps
    with pytest.raises(StrataError, match="16 weight rows a warp"):
        Tiles.parse("128x64x8x3h/64x8x3ht")
    with pytest.raises(StrataError, match="16 weight rows a warp: 32 for 4"):
        Tiles.parse("128x32x4x3ht")  # its down kernel: 32 weight rows
    t = Tiles.parse("128x64x8x3ht/64x4x3ht")
    assert t.trans and t.down.trans and str(t) == "128x64x8x3ht/64x4x3ht"
    r = Tiles.parse("128x64x8x3hr/128x128x8x3hr")
    assert r.regs and r.down.regs and not r.codes and str(r) == "128x64x8x3hr/128x8x3hr"
    c = Tiles.parse("128x64x8x3hrc/128x64x8x3hr")
    assert c.cap and not c.down.cap and c.launch_options == {"maxnreg": 128} and c.down.launch_options == {}
    assert str(c) == "128x64x8x3hrc/64x8x3hr"
    with pytest.raises(StrataError, match="16 rows a warp"):
        Tiles.parse("64x32x8x3ha")
    with pytest.raises(StrataError, match="16 rows a warp"):
        Tiles.parse("64x32x4x3h/64x8x3ha")
