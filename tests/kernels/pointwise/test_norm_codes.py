"""STRATA_DP4A's norm launches (`add_rms_norm_triton` / `add_norm_route_triton` / `rms_norm_triton` given
`rounded`): beside the residual
and the normed rows they write the rows' int8 codes, scales and code sums, which must be `quantize_x`'s bytes of the
normed rows they returned (quantize32's rounding: the launch compiles without FMA contraction, as its kernel), and
the residual, the normed rows and the routing those of the launch without them (on a GPU the normed rows within one
step of the dtype: the norm's sums may contract otherwise)."""

import pytest
import torch

from strata.kernels.moe.dp4a_gemv import quantize_x
from strata.kernels.pointwise.add_norm_route import add_norm_route_triton
from strata.kernels.pointwise.add_rms_norm import add_rms_norm_triton
from strata.kernels.pointwise.rms_norm import rms_norm_triton
from tests.kernels.pointwise.common import DEVICE, rand, ulp


def _buffers(rows: int, k: int):
    return (torch.empty(rows, k, dtype=torch.int8, device=DEVICE),
            torch.empty(rows, k // 32, dtype=torch.float32, device=DEVICE),
            torch.empty(rows, k // 32, dtype=torch.int32, device=DEVICE))


def _same_rows(got: torch.Tensor, want: torch.Tensor, dtype) -> bool:
    step = 0 if DEVICE == "cpu" else ulp(dtype)
    return bool(((got.float() - want.float()).abs() <= step * want.float().abs()).all())


def _codes_of(x: torch.Tensor, rounded) -> None:
    for got, want in zip(rounded, quantize_x(x)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows,k", [(1, 64), (3, 96)])  # 96: a row of 128 lanes, the last group masked
def test_add_rms_norm_writes_the_codes_of_its_rows(dtype, rows, k):
    h, delta = rand((rows, k), 41, dtype, 2), rand((rows, k), 42, dtype)
    weight = (1 + 0.1 * rand((k,), 43, torch.float32)).to(dtype)
    want_h, want_x = add_rms_norm_triton(h, delta, weight, 1e-6)
    rounded = _buffers(rows, k)
    got_h, got_x = add_rms_norm_triton(h, delta, weight, 1e-6, rounded)
    assert torch.equal(got_h, want_h) and _same_rows(got_x, want_x, dtype)
    _codes_of(got_x, rounded)
    assert rounded[0].abs().amax(1).eq(127).all()  # each row's largest value is a full code


@pytest.mark.parametrize("rows", [1, 2])
def test_add_norm_route_writes_the_codes_of_its_rows(rows):
    dtype, k = torch.bfloat16, 64
    h, delta = rand((rows, k), 44, dtype, 2), rand((rows, k), 45, dtype)
    weight = (1 + 0.1 * rand((k,), 46, torch.float32)).to(dtype)
    router = rand((8, k), 47, dtype, 0.05)
    want = add_norm_route_triton(h, delta, weight, router, 1e-6, 2, True)
    rounded = _buffers(rows, k)
    got = add_norm_route_triton(h, delta, weight, router, 1e-6, 2, True, rounded=rounded)
    assert torch.equal(got[0], want[0]) and _same_rows(got[1], want[1], dtype)
    if DEVICE == "cpu":  # the same sums in the interpreter: the same routing
        assert torch.equal(got[2], want[2]) and torch.equal(got[3], want[3])
    _codes_of(got[1], rounded)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows,k", [(1, 64), (2, 96)])
def test_rms_norm_writes_the_codes_of_its_rows(dtype, rows, k):
    """Layer 0's norm (the plain rms_norm, no residual add before it)."""
    x = rand((rows, k), 48, dtype, 2)
    weight = (1 + 0.1 * rand((k,), 49, torch.float32)).to(dtype)
    want = rms_norm_triton(x, weight, 1e-6)
    rounded = _buffers(rows, k)
    got = rms_norm_triton(x, weight, 1e-6, rounded)
    assert _same_rows(got, want, dtype)
    _codes_of(got, rounded)
    assert rounded[0].abs().amax(1).eq(127).all()
