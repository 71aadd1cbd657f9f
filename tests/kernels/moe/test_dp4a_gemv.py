"""The int8-activation Q4_0 GEMVs (`dp4a_gemv.py`) against float64 of the dequantized weights times the ORIGINAL x.

Bound (`row_error_bound`, float64): a row's error is at most sum over its weights of |w| * (d_x / 2 + 4u |x|) (x
rounded to the nearest code of its block's scale d_x, the rounding's own float32 steps 4u|x|) plus (n + 4) u * sum
|w| |x_rounded|, float32 rounding of n partial sums and their scale products (u = 2^-24). The same kernel with the
block code sums zeroed (so without the -8 offset) must fall outside it. Under TRITON_INTERPRET=1 (CPU) `dp4a` is
its integer emulation, checked here byte by byte against numpy.
"""

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from strata.errors import StrataError
from strata.kernels.moe import dp4a_gemv
from strata.kernels.moe.dp4a_gemv import dp4a_down, dp4a_gate_up, dp4a_matvec, quantize_x, quantize_x_ref

U = 2.0**-24


def q4_0(n_mats: int, n_out: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n_mats random Q4_0 matrices n_out x k: raw bytes (uint8, flat, matrices one after another) and float64."""
    from strata.quant import dequantize, get_format, random_blocks

    raw = torch.from_numpy(random_blocks("Q4_0", n_mats * n_out * k // 32, np.random.default_rng(seed), 0.02))
    w64 = dequantize(raw.reshape(n_mats * n_out, -1), get_format("Q4_0").ggml_type, (n_mats * n_out, k))
    return raw.reshape(-1), w64.double().reshape(n_mats, n_out, k)


def row_error_bound(w64: torch.Tensor, x: torch.Tensor, xq, terms: int = 0) -> torch.Tensor:
    """[T, n_out] float64: the stated bound of (w64 [n_out, K] . x[t]) for x [T, K] rounded as xq, the kernel
    summing `terms` float32 parts (a word's each; default K / 8, one matrix)."""
    codes, scales, _ = xq
    k = x.shape[1]
    step = scales.double().cpu().repeat_interleave(32, dim=1)  # [T, K]: each value's d_x
    rounded = codes.double().cpu() * step
    x_err = step / 2 + 4 * U * x.double().abs()
    terms = terms or 4 * k // 32
    return x_err @ w64.abs().T + (terms + 4) * U * (rounded.abs() @ w64.abs().T)


@triton.jit
def _dp4a_probe_kernel(a, b, c, out, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out + i, dp4a_gemv.dp4a(tl.load(a + i), tl.load(b + i), tl.load(c + i)))


def test_dp4a_is_four_signed_byte_products_added(device):
    rng = np.random.default_rng(1)
    a = rng.integers(-2**31, 2**31, 64, dtype=np.int64).astype(np.int32)
    b = rng.integers(-2**31, 2**31, 64, dtype=np.int64).astype(np.int32)
    a[:2], b[:2] = np.int32(-2139062144), np.int32(2139062143)  # bytes -128 x4 and 127 x4 (0x80808080, 0x7F7F7F7F)
    c = rng.integers(-2**20, 2**20, 64).astype(np.int32)
    want = c.astype(np.int64) + (a.view(np.int8).reshape(64, 4).astype(np.int64)
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


def test_matvec_within_the_rounding_bound_and_rows_independent_of_the_window(device):
    n_out, k = 40, 512  # 3 row tiles of 16, the last partial
    raw, w64 = q4_0(1, n_out, k, seed=3)
    x = torch.randn(4, k, generator=torch.Generator().manual_seed(4))
    x[1, 64:96] = 0  # an all-zero block: scale 0, codes 0
    xq = quantize_x(x.to(device))
    w = raw.to(device)
    y = dp4a_matvec(xq, w, n_out, bn=16)
    want = x.double() @ w64[0].T
    bound = row_error_bound(w64[0], x, xq)
    err = (y.cpu().double() - want).abs()
    assert (err <= bound).all(), (err / bound).max()
    assert (bound < 0.02 * (x.double().abs() @ w64[0].abs().T)).all()  # a bound that says something
    for r in range(4):  # each row as a one-row call gives the same bits (weights read once for the window)
        alone = dp4a_matvec(tuple(t[r:r + 1] for t in xq), w, n_out, bn=16)
        assert torch.equal(alone[0], y[r])
    codes, scales, sums = xq
    no_offset = dp4a_matvec((codes, scales, torch.zeros_like(sums)), w, n_out, bn=16)  # the kernel without -8
    assert ((no_offset.cpu().double() - want).abs() > bound).any()


def test_routed_down_within_the_rounding_bound(device):
    n_experts, ff, embd, top_k = 4, 256, 64, 2
    raw, w64 = q4_0(n_experts, embd, ff, seed=5)
    gen = torch.Generator().manual_seed(6)
    ids = torch.tensor([[2, 0], [1, 2], [3, 1]], dtype=torch.int32)
    weights = torch.softmax(torch.randn(3, top_k, generator=gen), dim=-1)
    h = torch.randn(3 * top_k, ff, generator=gen)
    hq = quantize_x(h.to(device))
    y = dp4a_down(hq, ids.to(device), weights.to(device), raw.to(device), embd * ff // 32 * 18, embd, bn=32)
    want = torch.zeros(3, embd, dtype=torch.float64)
    bound = torch.zeros(3, embd, dtype=torch.float64)
    for t in range(3):
        for j in range(top_k):
            p = t * top_k + j
            e = int(ids[t, j])
            want[t] += weights[t, j].double() * (h[p].double() @ w64[e].T)
            # all experts' words in one sum (8 blocks each: 64 terms), d_x times the combine weight (+1 rounding)
            one = row_error_bound(w64[e], h[p:p + 1], tuple(v[p:p + 1] for v in hq), terms=4 * 16 + 1)[0]
            bound[t] += weights[t, j].double() * one
    err = (y.cpu().double() - want).abs()
    assert (err <= bound).all(), (err / bound).max()


def test_gate_up_within_the_rounding_bound_and_swiglu_of_its_dots(device):
    n_experts, ff, embd, top_k = 3, 48, 256, 2
    raw_g, g64 = q4_0(n_experts, ff, embd, seed=7)
    raw_u, u64 = q4_0(n_experts, ff, embd, seed=8)
    ids = torch.tensor([[0, 2], [2, 1]], dtype=torch.int32)
    x = torch.randn(2, embd, generator=torch.Generator().manual_seed(9))
    xq = quantize_x(x.to(device))
    args = (xq, ids.to(device), raw_g.to(device), raw_u.to(device), ff * embd // 32 * 18, ff)
    dots = dp4a_gate_up(*args, swiglu=False, bn=32).cpu()  # 2 row tiles, the last partial
    for p in range(4):
        t, e = p // top_k, int(ids.view(-1)[p])
        xt, xqt = x[t:t + 1], tuple(v[t:t + 1] for v in xq)
        for got, w64 in ((dots[0, p], g64[e]), (dots[1, p], u64[e])):
            err = (got.double() - xt.double() @ w64.T).abs()
            assert (err <= row_error_bound(w64, xt, xqt)).all()
    hid = dp4a_gate_up(*args, bn=32).cpu()
    g, u = dots[0].double(), dots[1].double()
    assert torch.allclose(hid.double(), g * torch.sigmoid(g) * u, rtol=1e-5, atol=1e-9)


def test_weights_the_kernels_cannot_read_are_one_line_errors(device):
    raw, _ = q4_0(1, 8, 64, seed=10)
    xq = quantize_x(torch.randn(1, 64).to(device))
    with pytest.raises(StrataError, match="do not hold Q4_0 matrices of 16 x 64"):
        dp4a_matvec(xq, raw.to(device), 16)
    odd = torch.zeros(raw.numel() + 1, dtype=torch.uint8, device=device)[1:]
    odd.copy_(raw)
    with pytest.raises(StrataError, match="even address"):
        dp4a_matvec(xq, odd, 8)


def test_tiles_fill_an_h200_within_their_registers():
    from strata.kernels.moe.dp4a_gemv import LANE_WORDS, MIN_WARPS, dp4a_tile

    for n_out, units, programs, operands in [(5120, 64, 1, 1), (2048, 128, 1, 1), (768, 64, 8, 2), (2048, 192, 1, 1)]:
        bn, warps = dp4a_tile(n_out, units, programs, operands, True)
        words = operands * (1 << (units - 1).bit_length()) * 4 * bn / (32 * warps)
        assert words <= LANE_WORDS or warps == 16, (n_out, units, bn, warps)
        assert programs * -(-n_out // bn) * warps >= MIN_WARPS or bn == 1, (n_out, units, bn, warps)
