"""The fused RMSNorm and RoPE kernels against the torch forms the CPU path runs, and RMSNorm against float64."""

import pytest
import torch

from strata.kernels.pointwise.rms_norm import rms_norm_triton
from strata.kernels.pointwise.rope import rope_triton
from strata.models.layers import Rope, rms_norm

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Triton's interpreter converts float32 to bf16/fp16 without round-to-nearest-even (compiled kernels do round):
# on the CPU the kernels may sit one more step of the output dtype away from torch. Compiled, RoPE differs from
# torch's eager kernels by one step on 5-12 % of the elements (H200, Triton 3.6: the compiler fuses the product
# and the sum): a rounding step, not an error.
STEPS = 1 if DEVICE == "cuda" else 2


def _ulp(dtype):
    return 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10


def _torch_rms_norm(x, w, eps):
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@pytest.mark.parametrize("shape", [(1, 256), (3, 200), (2, 4, 128)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rms_norm_matches_torch_and_float64(shape, dtype):
    gen = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(shape, generator=gen) * 3).to(dtype).to(DEVICE)
    w = (1 + 0.1 * torch.randn(shape[-1], generator=gen)).to(dtype).to(DEVICE)
    got = rms_norm_triton(x, w, 1e-6)
    want = _torch_rms_norm(x, w, 1e-6)
    assert got.dtype == dtype and got.shape == x.shape
    # Only the float32 sum's order differs from torch's: at most one rounding step of the output dtype apart.
    ulp = _ulp(dtype)
    assert ((got.float() - want.float()).abs() <= STEPS * ulp * want.float().abs() + 1e-6).all()
    xd = x.double()
    exact = w.double() * xd / xd.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
    assert ((got.double() - exact).abs().max() / exact.abs().max()).item() < (STEPS + 1) * ulp


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rope_matches_torch_to_a_rounding_step(dtype):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(3, 4, 64, generator=gen).to(dtype).to(DEVICE)
    cos, sin = Rope(64, 1e6, torch.device(DEVICE)).cos_sin(torch.tensor([0, 7, 4000], device=DEVICE), dtype)
    half = 32
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    want = x * cos[:, None, :] + rotated * sin[:, None, :]
    got = rope_triton(x, cos, sin)
    bound = (STEPS + 1) * _ulp(dtype) * want.float().abs().amax(-1, keepdim=True)
    assert ((got.float() - want.float()).abs() <= bound).all()


def test_partial_rope_passes_the_rest_through():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 256, generator=gen).to(torch.bfloat16).to(DEVICE)
    cos, sin = Rope(64, 1e7, torch.device(DEVICE)).cos_sin(torch.tensor([1, 900], device=DEVICE), torch.bfloat16)
    got = rope_triton(x, cos, sin, 64)
    want = torch.cat((Rope.apply(x[..., :64].cpu(), cos.cpu(), sin.cpu()), x[..., 64:].cpu()), dim=-1)
    assert torch.equal(got[..., 64:].cpu(), x[..., 64:].cpu())
    err = (got[..., :64].float().cpu() - want[..., :64].float()).abs().max()
    assert err <= (STEPS + 1) * _ulp(torch.bfloat16) * want.float().abs().max()


def test_the_cpu_path_stays_torch():
    x = torch.randn(2, 4, 64, dtype=torch.bfloat16)
    w = torch.ones(64, dtype=torch.bfloat16)
    assert torch.equal(rms_norm(x, w, 1e-6), _torch_rms_norm(x, w, 1e-6))
    cos, sin = Rope(32, 1e6, torch.device("cpu")).cos_sin(torch.tensor([3, 4]), torch.bfloat16)
    rotated = Rope.apply_partial(x, cos, sin, 32)
    assert torch.equal(rotated, torch.cat((Rope.apply(x[..., :32], cos, sin), x[..., 32:]), dim=-1))


@pytest.mark.parametrize("normalize", [True, False])
def test_route_topk_picks_torch_experts_and_weights(normalize):
    from strata.kernels.pointwise.route_topk import route_topk_triton
    from strata.models.layers import route_topk

    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(5, 128, generator=gen)  # float32: no accidental ties (torch orders ties as it likes)
    logits[3, 40] = logits[3, 90] = 9.0  # a tie: the lower id first
    weights, ids = route_topk_triton(logits.to(DEVICE), 8, normalize)
    want_w, want_ids = route_topk(logits, 8, normalize)  # the CPU path: torch
    want_ids[3, :2] = torch.tensor([40, 90])
    assert ids.dtype == torch.int64 and weights.dtype == torch.float32
    assert torch.equal(ids.cpu(), want_ids) and ids[3, 0].item() == 40 and ids[3, 1].item() == 90
    assert (weights.cpu() - want_w).abs().max().item() <= 1e-6
    if normalize:
        assert torch.allclose(weights.sum(-1).cpu(), torch.ones(5))


@pytest.mark.parametrize("n_experts, k", [(60, 4), (512, 10)])
def test_route_topk_over_padded_and_negative_rows(n_experts, k):
    """Rows of only negative logits, one all -inf but one, and expert counts that pad the kernel's block (the
    softmax's max and the picks compare float bits as integers: the padding's -inf and -1.0 must stay below)."""
    from strata.kernels.pointwise.route_topk import route_topk_triton
    from strata.models.layers import route_topk

    gen = torch.Generator().manual_seed(12)
    logits = torch.randn(4, n_experts, generator=gen)
    logits[1] = -120.0 - 200.0 * torch.rand(n_experts, generator=gen)  # all far below 0, 200 apart: exp under- or
    # overflows unless the max subtracted is the largest
    logits[2] = float("-inf")
    logits[2, n_experts - 1] = -3.0  # one finite expert: the rest's softmax is exactly zero, ties to the lower ids
    weights, ids = route_topk_triton(logits.to(DEVICE), k, True)
    want_w, want_ids = route_topk(logits, k, True)
    want_ids[2] = torch.tensor([n_experts - 1, *range(k - 1)])  # (torch orders the zeros as it likes)
    assert torch.equal(ids.cpu(), want_ids)
    assert (weights.cpu() - want_w).abs().max().item() <= 1e-6
