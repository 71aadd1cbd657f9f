"""The dense quantized matvec of decode steps against float64 on the dequantized weight.

Bound: max |kernel - float64| <= ERROR_BOUND (1e-5) * max |float64| (the decode expert kernels' bound: the weights
are decoded exactly, sums in float32)."""

import numpy as np
import pytest
import torch

from strata.kernels.quant.matvec import ERROR_BOUND, MAX_ROWS, matvec_applies, quant_matvec
from strata.quant import dequantize, get_format
from strata.quant.random_blocks import random_blocks
from tests.kernels import DEVICE


def _blocks(fmt: str, n_out: int, n_in: int, seed: int) -> torch.Tensor:
    """uint8 [n_out, row bytes] of valid random blocks."""
    n_blocks = n_out * n_in // get_format(fmt).block_size
    return torch.from_numpy(random_blocks(fmt, n_blocks, np.random.default_rng(seed))).reshape(n_out, -1)


@pytest.mark.parametrize("fmt", ["Q2_0", "Q4_0", "Q8_0", "Q4_K", "IQ2_XS", "IQ3_S"])
@pytest.mark.parametrize("rows", [1, 3])
def test_matvec_matches_float64(fmt, rows):
    n_out, n_in = 24, 512
    fmt_info = get_format(fmt)
    qtype = fmt_info.ggml_type
    raw = _blocks(fmt, n_out, n_in, seed=5)
    x = torch.randn(rows, n_in, generator=torch.Generator().manual_seed(rows))
    want = x.double() @ dequantize(raw, qtype, (n_out, n_in)).double().T
    got = quant_matvec(x.to(DEVICE), raw.to(DEVICE), qtype, (n_out, n_in)).cpu()
    assert got.shape == (rows, n_out) and got.dtype == torch.float32
    err = float((got.double() - want).abs().max() / want.abs().max())
    assert err <= ERROR_BOUND, f"{fmt}: {err:.2e}"


def test_leading_dims_are_kept():
    qtype = get_format("Q8_0").ggml_type
    raw = _blocks("Q8_0", 8, 64, seed=1)
    x = torch.randn(2, 1, 64)
    got = quant_matvec(x.to(DEVICE), raw.to(DEVICE), qtype, (8, 64)).cpu()
    want = x @ dequantize(raw, qtype, (8, 64)).T
    assert got.shape == (2, 1, 8)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_only_decode_steps_on_the_gpu_take_the_kernel():
    q4k = get_format("Q4_K").ggml_type
    q6k = get_format("Q6_K").ggml_type
    assert not matvec_applies(torch.zeros(1, 256, dtype=torch.bfloat16), q4k)  # CPU: the reference path
    if torch.cuda.is_available():
        one = torch.zeros(1, 256, dtype=torch.bfloat16, device="cuda")
        assert matvec_applies(one, q4k)
        assert not matvec_applies(one, q6k)  # not a format the decode kernels read
        assert not matvec_applies(one.float(), q4k)  # float32 stays on the exact reference path
        assert not matvec_applies(torch.zeros(MAX_ROWS + 1, 256, dtype=torch.bfloat16, device="cuda"), q4k)


@pytest.mark.parametrize("fmt", ["Q2_0", "Q4_0", "Q8_0", "Q4_K", "IQ3_XXS"])
def test_word_and_byte_kernels_odd_outputs_and_bf16_rows(fmt):
    from dataclasses import replace

    from strata.kernels.moe.decode import SPECS
    from strata.kernels.moe.gemv import byte_config, gemv_config

    n_out, n_in = 37, 512  # 37 outputs: not a multiple of any tile
    qtype = get_format(fmt).ggml_type
    raw = _blocks(fmt, n_out, n_in, seed=7)
    x = torch.randn(2, n_in, generator=torch.Generator().manual_seed(9))
    want = x.double() @ dequantize(raw, qtype, (n_out, n_in)).double().T
    words = gemv_config("matvec", SPECS[fmt], n_out, n_in, 1, False)
    assert words.wide  # the default for these formats: the word kernel
    for cfg in (words, byte_config("matvec", SPECS[fmt], n_out, n_in, 1, False)):
        got = quant_matvec(x.to(DEVICE), raw.to(DEVICE), qtype, (n_out, n_in), config=cfg).cpu()
        err = float((got.double() - want).abs().max() / want.abs().max())
        assert err <= ERROR_BOUND, f"{fmt} {cfg}: {err:.2e}"
    # bf16 rows are read as they are (exact in float32): only the bf16 output's own rounding adds to the error, one
    # bf16 ulp of the largest output at most (2^-7 of it: Triton's interpreter rounds to bf16 toward zero); the same
    # through the input split in two (its partial sums are float32, summed into the bf16 output).
    want = x.to(torch.bfloat16).double() @ dequantize(raw, qtype, (n_out, n_in)).double().T
    for cfg in (None, replace(words, ns=max(1, words.ns // 2), split=2)):
        got = quant_matvec(x.to(DEVICE, torch.bfloat16), raw.to(DEVICE), qtype, (n_out, n_in), config=cfg).cpu()
        assert got.dtype == torch.bfloat16
        assert float((got.double() - want).abs().max() / want.abs().max()) <= 2 ** -7


def test_misaligned_weights_fall_back_to_the_byte_kernel():
    qtype = get_format("Q4_0").ggml_type
    raw = _blocks("Q4_0", 8, 64, seed=2)
    from strata.kernels.moe.decode import SPECS
    from strata.kernels.moe.wide_gemv import word_gemv_applies

    odd = torch.zeros(raw.numel() + 1, dtype=torch.uint8, device=DEVICE)
    odd[1:] = raw.reshape(-1).to(DEVICE)
    shifted = odd[1:].reshape(8, -1)  # an odd data pointer: no 16-bit loads
    assert not word_gemv_applies(SPECS["Q4_0"], shifted.data_ptr())
    x = torch.randn(1, 64)
    want = x.double() @ dequantize(raw, qtype, (8, 64)).double().T
    got = quant_matvec(x.to(DEVICE), shifted, qtype, (8, 64)).cpu()
    assert float((got.double() - want).abs().max() / want.abs().max()) <= ERROR_BOUND


def test_routing_constants_are_made_once_per_device_and_row_count():
    from strata.kernels.quant.matvec import one_expert

    assert one_expert(torch.device(DEVICE), 3) is one_expert(torch.device(DEVICE), 3)
    ids, ones = one_expert(torch.device(DEVICE), 2)
    assert ids.shape == ones.shape == (2, 1) and not ids.any() and bool((ones == 1).all())
