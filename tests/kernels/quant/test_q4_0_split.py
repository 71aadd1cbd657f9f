"""Split Q4_0 rows (codes first, 16-byte aligned) and their dp4a decode matvec, against float64 of the GGUF blocks.

Bound: `dp4a_gemv.row_error_bound` (x rounded to int8 codes a 32 values, then exact integer dots and float32 sums of
one part a block), as the dp4a matvec on GGUF rows."""

import json
import os

if __name__ == "__main__":  # building for the GPU: Triton imported before strata.kernels can switch the interpreter on
    os.environ.pop("TRITON_INTERPRET", None)
    import triton  # noqa: F401

import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402

from strata.kernels.moe.dp4a_gemv import dp4a_matvec, quantize_x, row_error_bound  # noqa: E402
from strata.kernels.quant.matvec import ERROR_BOUND  # noqa: E402
from strata.kernels.quant.q4_0_split import join_rows, split_dp4a_matvec, split_rows, splits  # noqa: E402
from strata.quant import dequantize, get_format  # noqa: E402
from tests.kernels import DEVICE  # noqa: E402
from tests.kernels.quant.test_matvec import _blocks  # noqa: E402
from tests.kernels.sm90 import builds_of, needs_ptxas  # noqa: E402


Q4_0 = get_format("Q4_0").ggml_type


def _rows(n_out: int, n_in: int, seed: int) -> torch.Tensor:
    return _blocks("Q4_0", n_out, n_in, seed)


def test_split_is_a_permutation_of_each_row():
    raw = _rows(5, 512, seed=1)
    split = split_rows(raw)
    assert split.shape == raw.shape
    assert torch.equal(join_rows(split), raw)
    assert torch.equal(split[:, :16], raw[:, 2:18])  # the first block's codes lead the row
    assert torch.equal(split[:, 256:258], raw[:, :2])  # its scale follows the row's 16 x 16 code bytes
    assert all(torch.equal(split[r].sort().values, raw[r].sort().values) for r in range(5))


def test_only_rows_of_256_weights_split():
    assert splits(256) and splits(2048) and splits(768)
    assert not splits(128) and not splits(0) and not splits(800)


@pytest.mark.parametrize("n_out,n_in,rows,bn", [(24, 512, 1, 8), (20, 768, 2, 16), (7, 256, 3, 4)])
def test_dp4a_matvec_within_its_rounding_bound(n_out, n_in, rows, bn):
    raw = _rows(n_out, n_in, seed=n_in + 1)
    x = torch.randn(rows, n_in, generator=torch.Generator().manual_seed(rows))
    w64 = dequantize(raw, Q4_0, (n_out, n_in)).double()
    want = x.double() @ w64.T
    xq = quantize_x(x.to(DEVICE))
    got = split_dp4a_matvec(xq, split_rows(raw).to(DEVICE), n_out, bn=bn).cpu().double()
    assert got.shape == (rows, n_out)
    bound = row_error_bound(w64, x, xq, terms=n_in // 32)
    assert ((got - want).abs() <= bound).all(), f"{float(((got - want).abs() / bound).max()):.2f} of the bound"
    assert float((got - want).abs().max() / want.abs().max()) > ERROR_BOUND  # x's rounding shows: not a float path
    gguf = dp4a_matvec(xq, raw.to(DEVICE), n_out).cpu().double()  # the GGUF rows' kernel: the same integer dots
    assert float((got - gguf).abs().max()) <= 1e-5 * float(want.abs().max())


def test_a_row_computes_alike_whatever_the_rows_beside_it():
    raw = split_rows(_rows(16, 512, seed=3)).to(DEVICE)
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    together = split_dp4a_matvec(quantize_x(x), raw, 16)
    for r in range(3):
        assert torch.equal(split_dp4a_matvec(quantize_x(x[r:r + 1]), raw, 16)[0], together[r])


def test_a_weight_of_other_rows_is_refused():
    for n_in, row_bytes in ((512, 200), (160, 90)):
        xq = quantize_x(torch.zeros(1, n_in, device=DEVICE))
        with pytest.raises(ValueError, match="split Q4_0 rows"):
            split_dp4a_matvec(xq, torch.zeros(4, row_bytes, dtype=torch.uint8, device=DEVICE), 4)


def build_sm90(k: int, rows: int = 1) -> dict:
    """The split dp4a kernel at the decode step's tile (`dp4a_step.SPLIT_TILE`) built for sm_90 without a GPU:
    registers, spill stack, SASS instructions a weight (a static count: no loops) and IDP.4A instructions."""
    from strata.kernels.quant import q4_0_split
    from strata.models.dp4a_step import SPLIT_TILE
    from tests.kernels.sm90 import sass_counts

    bn, warps = SPLIT_TILE
    signature = {"xq": "*i8", "xs": "*fp32", "xsum": "*i32", "w": "*u8", "y": "*bf16", "n_out": "i32"}
    constants = dict(K=k, NBP=triton.next_power_of_2(k // 32), BN=bn, ROWS=rows, PDL=1)
    regs, stack, executed, dp4a = sass_counts(q4_0_split._split_dp4a_kernel, signature, constants, warps)
    return {"k": k, "rows": rows, "regs": regs, "stack": stack, "dp4a": dp4a,
            "per_weight": round(executed * 32 * warps / (bn * k), 2)}


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the device probe builds and times it")
@needs_ptxas
def test_the_kernel_builds_for_sm90_without_spills():
    """A3B's q/k/v (K 2,048) and o (K 4,096) at the step's tile, one row and a verify window's four: no spills, the
    dp4a instruction itself, ~2 instructions a weight a row (session 15's builds: 1.3-2.1; the float one-shot
    kernels ~7)."""
    builds = builds_of(__file__)
    assert len(builds) == 3, builds
    for b in builds:
        assert b["stack"] == 0 and b["dp4a"] > 0 and b["per_weight"] < 3 * b["rows"], b


if __name__ == "__main__":
    for k, rows in ((2048, 1), (4096, 1), (2048, 4)):
        print(json.dumps(build_sm90(k, rows)), flush=True)
