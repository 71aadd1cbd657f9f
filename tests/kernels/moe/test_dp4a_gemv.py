"""The int8-activation Q4_0 GEMVs (`dp4a_gemv.py`) against float64 of the dequantized weights times the ORIGINAL x.

Bound (`dp4a_gemv.row_error_bound`, float64): a row's error is at most sum over its weights of |w| * (d_x / 2 +
4u |x|) (x rounded to the nearest code of its block's scale d_x, the rounding's own float32 steps 4u|x|) plus
(n + 4) u * sum |w| |x_rounded|, float32 rounding of n parts and their scale products (u = 2^-24). The same kernel
with the block code sums zeroed (so without the -8 offset) must fall outside it. Under TRITON_INTERPRET=1 (CPU)
`dp4a` is its integer emulation, checked here byte by byte against numpy (on a GPU: the instruction itself).
"""

import json
import os

if __name__ == "__main__":  # building for the GPU: Triton imported before strata.kernels can switch the interpreter on
    os.environ.pop("TRITON_INTERPRET", None)
    import triton  # noqa: F401

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from strata.errors import StrataError  # noqa: E402
from strata.kernels.moe import dp4a_gemv  # noqa: E402
from strata.kernels.moe.dp4a_gemv import (  # noqa: E402
    dp4a_down, dp4a_gate_up, dp4a_matvec, quantize_x, quantize_x_ref, row_error_bound)

from tests.kernels.sm90 import builds_of, needs_ptxas, sass_counts  # noqa: E402


def q4_0(n_mats: int, n_out: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n_mats random Q4_0 matrices n_out x k: raw bytes (uint8, flat, matrices one after another) and float64."""
    from strata.quant import dequantize, get_format, random_blocks

    raw = torch.from_numpy(random_blocks("Q4_0", n_mats * n_out * k // 32, np.random.default_rng(seed), 0.02))
    w64 = dequantize(raw.reshape(n_mats * n_out, -1), get_format("Q4_0").ggml_type, (n_mats * n_out, k))
    return raw.reshape(-1), w64.double().reshape(n_mats, n_out, k)


@triton.jit
def _dp4a_probe_kernel(a, b, c, out, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out + i, dp4a_gemv.dp4a(tl.load(a + i), tl.load(b + i), tl.load(c + i)))


def test_dp4a_adds_four_unsigned_by_signed_byte_products(device):
    rng = np.random.default_rng(1)
    a = rng.integers(-2**31, 2**31, 64, dtype=np.int64).astype(np.int32)
    b = rng.integers(-2**31, 2**31, 64, dtype=np.int64).astype(np.int32)
    a[:2], b[:2] = np.int32(-1), np.int32(-2139062144)  # bytes 255 x4 and -128 x4 (0xFFFFFFFF, 0x80808080)
    c = rng.integers(-2**20, 2**20, 64).astype(np.int32)
    want = c.astype(np.int64) + (a.view(np.uint8).reshape(64, 4).astype(np.int64)
                                 * b.view(np.int8).reshape(64, 4).astype(np.int64)).sum(1)
    out = torch.empty(64, dtype=torch.int32, device=device)
    _dp4a_probe_kernel[(1,)](*(torch.from_numpy(v).to(device) for v in (a, b, c)), out, N=64)
    assert np.array_equal(out.cpu().numpy().astype(np.int64), want)


def test_quantize_x_is_the_reference_rounding(device):
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(2)) * 3
    got, ref = quantize_x(x.to(device)), quantize_x_ref(x)
    assert all(torch.equal(a.cpu(), b) for a, b in zip(got, ref))
    assert torch.equal(ref[2], ref[0].view(3, 8, 32).int().sum(-1))
    with pytest.raises(StrataError, match="not \\[rows, a multiple of 32\\]"):
        quantize_x(torch.zeros(2, 48))


@pytest.mark.parametrize("layout", dp4a_gemv.LAYOUTS)
def test_matvec_within_the_rounding_bound_and_rows_independent_of_the_window(device, layout):
    n_out, k = 40, 512  # 3 row tiles of 16, the last partial
    raw, w64 = q4_0(1, n_out, k, seed=3)
    x = torch.randn(4, k, generator=torch.Generator().manual_seed(4))
    x[1, 64:96] = 0  # an all-zero block: scale 0, codes 0
    xq = quantize_x(x.to(device))
    w = raw.to(device)
    y = dp4a_matvec(xq, w, n_out, bn=16, layout=layout)
    want = x.double() @ w64[0].T
    bound = row_error_bound(w64[0], x, xq)
    err = (y.cpu().double() - want).abs()
    assert (err <= bound).all(), (err / bound).max()
    assert (bound < 0.02 * (x.double().abs() @ w64[0].abs().T)).all()  # a bound that says something
    for r in range(4):  # each row as a one-row call gives the same bits (weights read once for the window)
        alone = dp4a_matvec(tuple(t[r:r + 1] for t in xq), w, n_out, bn=16, layout=layout)
        assert torch.equal(alone[0], y[r])
    codes, scales, sums = xq
    # the same kernel without the -8 offset (block sums zeroed) falls outside the bound
    no_offset = dp4a_matvec((codes, scales, torch.zeros_like(sums)), w, n_out, bn=16, layout=layout)
    assert ((no_offset.cpu().double() - want).abs() > bound).any()


@pytest.mark.parametrize("layout", dp4a_gemv.LAYOUTS)
def test_routed_down_within_the_rounding_bound(device, layout):
    n_experts, ff, embd, top_k = 4, 256, 64, 3  # 3 x 8 blocks a row: 8 padding units (the last expert again)
    raw, w64 = q4_0(n_experts, embd, ff, seed=5)
    gen = torch.Generator().manual_seed(6)
    ids = torch.tensor([[2, 0, 3], [1, 2, 0], [3, 1, 2]], dtype=torch.int32)
    weights = torch.softmax(torch.randn(3, top_k, generator=gen), dim=-1)
    h = torch.randn(3 * top_k, ff, generator=gen)
    hq = quantize_x(h.to(device))
    y = dp4a_down(hq, ids.to(device), weights.to(device), raw.to(device), embd * ff // 32 * 18, embd, bn=32,
                  layout=layout)
    want = torch.zeros(3, embd, dtype=torch.float64)
    bound = torch.zeros(3, embd, dtype=torch.float64)
    for t in range(3):
        for j in range(top_k):
            p = t * top_k + j
            e = int(ids[t, j])
            want[t] += weights[t, j].double() * (h[p].double() @ w64[e].T)
            # the experts' blocks in one float32 sum (32 with the padding, 8 parts each in the HALFWORDS layout),
            # d_x times the combine weight (one rounding more)
            one = row_error_bound(w64[e], h[p:p + 1], tuple(v[p:p + 1] for v in hq), terms=8 * 32 + 1)[0]
            bound[t] += weights[t, j].double() * one
    err = (y.cpu().double() - want).abs()
    assert (err <= bound).all(), (err / bound).max()


@pytest.mark.parametrize("layout", dp4a_gemv.LAYOUTS)
def test_gate_up_within_the_rounding_bound_and_swiglu_of_its_dots(device, layout):
    n_experts, ff, embd, top_k = 3, 48, 256, 2
    raw_g, g64 = q4_0(n_experts, ff, embd, seed=7)
    raw_u, u64 = q4_0(n_experts, ff, embd, seed=8)
    ids = torch.tensor([[0, 2], [2, 1]], dtype=torch.int32)
    x = torch.randn(2, embd, generator=torch.Generator().manual_seed(9))
    xq = quantize_x(x.to(device))
    args = (xq, ids.to(device), raw_g.to(device), raw_u.to(device), ff * embd // 32 * 18, ff)
    dots = dp4a_gate_up(*args, swiglu=False, bn=32, layout=layout).cpu()  # 2 row tiles, the last partial
    for p in range(4):
        t, e = p // top_k, int(ids.view(-1)[p])
        xt, xqt = x[t:t + 1], tuple(v[t:t + 1] for v in xq)
        for got, w64 in ((dots[0, p], g64[e]), (dots[1, p], u64[e])):
            err = (got.double() - xt.double() @ w64.T).abs()
            assert (err <= row_error_bound(w64, xt, xqt)).all()
    hid = dp4a_gate_up(*args, bn=32, layout=layout).cpu()
    g, u = dots[0].double(), dots[1].double()
    assert torch.allclose(hid.double(), g * torch.sigmoid(g) * u, rtol=1e-5, atol=1e-9)


def test_gate_up_epilogue_writes_the_codes_quantize_x_gives_its_h(device):
    """STRATA_DP4A's H: the gate/up epilogue's codes, scales and sums are `quantize_x`'s bytes on the H it computed
    (two 32-row tiles of 64 rows; tile 64 too: two groups a program), and with no float H the same bytes."""
    n_experts, ff, embd, top_k = 3, 64, 128, 2
    raw_g, _ = q4_0(n_experts, ff, embd, seed=17)
    raw_u, _ = q4_0(n_experts, ff, embd, seed=18)
    ids = torch.tensor([[1, 2], [0, 1]], dtype=torch.int32)
    xq = quantize_x(torch.randn(2, embd, generator=torch.Generator().manual_seed(19)).to(device))
    args = (xq, ids.to(device), raw_g.to(device), raw_u.to(device), ff * embd // 32 * 18, ff)
    plain = dp4a_gate_up(*args, layout="pairs")
    for bn in (32, 64):
        hid, hq = dp4a_gate_up(*args, bn=bn, layout="pairs", rounded="both")
        # Equal up to float32 rounding: on CUDA each variant compiles its own FMA contraction of the epilogue, so a
        # value whose dots cancel may differ by a few float32 steps of the largest (not of its own size).
        torch.testing.assert_close(hid, plain, rtol=1e-6, atol=1e-6 * plain.abs().max().item())
        for got, want in zip(hq, quantize_x(hid)):
            assert got.dtype == want.dtype and torch.equal(got, want)
        for got, want in zip(dp4a_gate_up(*args, bn=bn, layout="pairs", rounded="codes"), hq):
            assert torch.equal(got, want)
    with pytest.raises(StrataError, match="whole groups of 32: 64 rows, tile 16"):
        dp4a_gate_up(*args, bn=16, rounded="codes")
    with pytest.raises(StrataError, match="whole groups of 32"):
        dp4a_gate_up(*args, swiglu=False, rounded="codes")


def test_weights_the_kernels_cannot_read_are_one_line_errors(device):
    raw, _ = q4_0(1, 8, 64, seed=10)
    xq = quantize_x(torch.randn(1, 64).to(device))
    with pytest.raises(StrataError, match="do not hold Q4_0 matrices of 16 x 64"):
        dp4a_matvec(xq, raw.to(device), 16)
    odd = torch.zeros(raw.numel() + 1, dtype=torch.uint8, device=device)[1:]
    odd.copy_(raw)
    with pytest.raises(StrataError, match="even address"):
        dp4a_matvec(xq, odd, 8)
    raw, _ = q4_0(1, 8, 96, seed=11)  # 3 blocks a row: no whole pairs
    with pytest.raises(StrataError, match="pairs layout reads 4-aligned block pairs: input width 96"):
        dp4a_matvec(quantize_x(torch.randn(1, 96).to(device)), raw.to(device), 8, layout="pairs")
    with pytest.raises(StrataError, match="layout 'rows' is not one of blocks, halfwords, pairs"):
        dp4a_matvec(xq, raw.to(device), 8, layout="rows")


def test_tiles_fill_an_h200_within_their_registers():
    from strata.kernels.moe.dp4a_gemv import LANE_BLOCKS, MIN_WARPS, dp4a_tile

    for n_out, units, programs, operands in [(5120, 64, 1, 1), (2048, 128, 1, 1), (768, 64, 8, 2), (2048, 192, 1, 1)]:
        bn, warps = dp4a_tile(n_out, units, programs, operands, True)
        blocks = operands * (1 << (units - 1).bit_length()) * bn / (32 * warps)
        assert blocks <= LANE_BLOCKS or warps == 16, (n_out, units, bn, warps)
        assert programs * -(-n_out // bn) * warps >= MIN_WARPS or bn == 1, (n_out, units, bn, warps)
    bn, warps = dp4a_tile(768, 64, 8, 2, True, group=32)  # A3B's gate/up rounding H: whole groups, 16 warps
    assert (bn, warps) == (32, 16) and 2 * 64 * bn / (32 * warps) <= LANE_BLOCKS
    assert dp4a_tile(768, 64, 8, 2, False, group=32)[0] == 32


# The A3B shapes (kind, rows, input width, top_k): q/k/v stacked, o, the experts' gate/up and down
A3B = [("matvec", 5120, 2048, 1), ("matvec", 2048, 4096, 1), ("gate_up", 768, 2048, 8), ("down", 2048, 768, 8)]


def build_sm90(kind: str, n_out: int, k: int, top_k: int, bn: int = 0, warps: int = 0, rows: int = 1,
               layout: str = "blocks", quant: bool = False) -> dict:
    """One A3B form of the dp4a kernels built for sm_90: registers, spills, SASS instructions a weight (a static
    count: these kernels have no loops; all programs' threads over the weights read) and IDP.4A instructions."""
    units = k // 32 * (top_k if kind == "down" else 1)
    operands, programs = (2, top_k) if kind == "gate_up" else (1, 1)
    d_bn, d_warps = dp4a_gemv.dp4a_tile(n_out, units, programs, operands, True, 32 if quant else 1)
    bn, warps = bn or d_bn, warps or d_warps
    x = {"xq": "*i32", "xs": "*fp32", "xsum": "*i32", "ids": "*i32"}
    nu = dp4a_gemv._units(dp4a_gemv.LAYOUTS.index(layout), units)
    if kind == "gate_up":
        kernel = dp4a_gemv._dp4a_gate_up_kernel
        signature = {**x, "wg": "*u8", "wu": "*u8", "hid": "*fp32", "stride_g": "i64", "stride_u": "i64"}
        constants = dict(N_OUT=n_out, K=k, TOP_K=top_k, NU=nu, BN=bn, SWIGLU=True,
                         LAYOUT=dp4a_gemv.LAYOUTS.index(layout))
        constants.update(QUANT=0, STORE_H=1)  # (a constexpr left out builds as None: no float H stored)
        if quant:  # STRATA_DP4A's form: H's codes from the epilogue, no float H
            signature.update({"codes": "*i8", "scales": "*fp32", "sums": "*i32"})
            constants.update(QUANT=1, STORE_H=0)
    else:
        kernel = dp4a_gemv._dp4a_down_kernel
        signature = {**x, "topk_w": "*fp32", "w": "*u8", "y": "*fp32", "stride": "i64"}
        constants = dict(N_OUT=n_out, K=k, TOP_K=top_k, NU=nu, BN=bn, ROWS=rows, SHARED=kind == "matvec",
                         LAYOUT=dp4a_gemv.LAYOUTS.index(layout))
    regs, stack, executed, dp4a = sass_counts(kernel, signature, constants, warps, fusion=not quant)
    threads = 32 * warps * -(-n_out // bn) * programs
    return {"kernel": "dp4a", "kind": kind, "n_out": n_out, "k": k, "bn": bn, "warps": warps, "rows": rows,
            "layout": layout, "quant": quant, "regs": regs, "stack": stack,
            "per_weight": round(executed * threads / (n_out * k * top_k * operands), 2), "dp4a": dp4a}


def build_oneshot_sm90(kind: str, n_out: int, k: int, top_k: int) -> dict:
    """The same count for the float one-shot kernel the engine runs today at its default tile (the comparison)."""
    from strata.kernels.moe import oneshot_gemv
    from strata.kernels.moe.decode import SPECS
    from strata.kernels.moe.gemv import gemv_config

    spec = SPECS["Q4_0"]
    cfg = gemv_config(kind, spec, n_out, k, top_k, True)
    if kind == "gate_up":
        kernel = oneshot_gemv._oneshot_gate_up_kernel
        signature = {"x": "*bf16", "ids": "*i32", "slot_of": "*i32", "wg": "*u8", "wu": "*u8", "hid": "*fp32",
                     "stride_g": "i64", "stride_u": "i64"}
        constants = {**oneshot_gemv._constants(spec, n_out, k, 1, False, cfg.bn, cfg.split), "TOP_K": top_k}
    else:
        kernel = oneshot_gemv._oneshot_down_kernel
        signature = {"h": "*bf16" if kind == "matvec" else "*fp32", "ids": "*i32", "topk_w": "*fp32",
                     "slot_of": "*i32", "wd": "*u8", "y": "*fp32", "stride_d": "i64"}
        constants = {**oneshot_gemv._constants(spec, n_out, k, top_k, False, cfg.bn, cfg.split), "ROWS": 1,
                     "SHARED": kind == "matvec"}
    regs, stack, executed, _ = sass_counts(kernel, signature, constants, cfg.warps)
    operands, programs = (2, top_k) if kind == "gate_up" else (1, 1)
    threads = 32 * cfg.warps * -(-n_out // cfg.bn) * programs * cfg.split
    return {"kernel": "oneshot", "kind": kind, "n_out": n_out, "k": k, "bn": cfg.bn, "warps": cfg.warps,
            "split": cfg.split, "regs": regs, "stack": stack,
            "per_weight": round(executed * threads / (n_out * k * top_k * operands), 2)}


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the device probe builds and times them")
@needs_ptxas
def test_kernels_build_for_sm90_with_dp4a_and_without_spills():
    builds = builds_of(__file__)
    oneshot = {b["kind"] + str(b["n_out"]): b for b in builds if b["kernel"] == "oneshot"}
    dp4a = [b for b in builds if b["kernel"] == "dp4a"]
    assert len(oneshot) == len(A3B) and len(dp4a) == len(dp4a_gemv.LAYOUTS) * len(A3B) + 2, builds
    for b in dp4a:  # no spills, the instruction itself, and well under the float kernel's count a weight (~7;
        # halfwords, the coalesced layout, ~5: under it)
        old = oneshot[b["kind"] + str(b["n_out"])]["per_weight"]
        assert b["stack"] == 0 and b["dp4a"] > 0, b
        assert b["per_weight"] < (old if b["layout"] == "halfwords" else old / 2) * b["rows"], (b, old)


if __name__ == "__main__":
    for shape in A3B:
        print(json.dumps(build_oneshot_sm90(*shape)), flush=True)
    for layout in dp4a_gemv.LAYOUTS:
        for shape in A3B:
            print(json.dumps(build_sm90(*shape, layout=layout)), flush=True)
    print(json.dumps(build_sm90(*A3B[0], rows=4)), flush=True)  # a verify window's 4 rows
    print(json.dumps(build_sm90(*A3B[2], layout="pairs", quant=True)), flush=True)  # H rounded in the epilogue
