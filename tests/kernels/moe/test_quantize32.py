import torch

from strata.kernels.moe.quantize32 import dequantize_rows_int8, quantize_rows, quantize_rows_ref, quantize_rows_triton


def test_rounding_matches_reference_exactly(device):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(37, 320, generator=g) * torch.exp(torch.randn(37, 1, generator=g))
    x[3] = 0  # a zero row: codes and scales exactly 0
    x[5, 7] = 1e4  # one large value owns its group's scale
    x[9, :32] = torch.arange(32) - 15.5  # halves: ties go to even
    for dtype in (torch.float32, torch.bfloat16):
        got = [t.cpu() for t in quantize_rows_triton(x.to(device, dtype))]
        ref = quantize_rows_ref(x.to(dtype))
        for a, b in zip(got, ref):
            assert torch.equal(a, b)
    codes, scales, sums = quantize_rows_ref(x)
    assert (codes[3] == 0).all() and (scales[3] == 0).all()
    assert codes.abs().max() == 127 and torch.equal(sums, codes.view(37, 10, 32).int().sum(-1))
    err = (dequantize_rows_int8(codes, scales) - x.double()).abs()
    assert (err <= scales.double().repeat_interleave(32, 1) * 0.5001).all()


def test_dispatch_takes_reference_on_cpu():
    x = torch.randn(4, 64)
    assert all(torch.equal(a, b) for a, b in zip(quantize_rows(x), quantize_rows_ref(x)))
