"""The decode step's fused kernels (residual add + RMSNorm, the dense KV write, the gated shared expert's combine,
int32 routing ids) against the torch forms the CPU path runs, and against float64 with the bounds stated."""

import pytest
import torch

from strata.kernels.pointwise.add_rms_norm import add_rms_norm_triton
from strata.kernels.pointwise.shared_gate import shared_gate_triton
from strata.kernels.pointwise.store_kv import store_kv_ref, store_kv_triton
from strata.models.layers import add_gated_shared, add_rms_norm, rms_norm
from tests.kernels.pointwise.common import DEVICE, STEPS, rand, ulp


@pytest.mark.parametrize("shape", [(1, 256), (3, 200)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_add_rms_norm_matches_torch_and_float64(shape, dtype):
    h, delta = rand(shape, 1, dtype, 3), rand(shape, 2, dtype)
    w = (1 + 0.1 * rand(shape[-1:], 3, torch.float32)).to(dtype)
    residual, normed = add_rms_norm_triton(h, delta, w, 1e-6)
    want_residual = h + delta  # torch: the float32 sum rounded once, as the kernel does
    want = rms_norm(want_residual, w, 1e-6)
    one_step = ulp(dtype)
    sum_bound = STEPS * one_step * want_residual.float().abs() + 1e-6  # the interpreter truncates (DEVICE cpu)
    assert ((residual.float() - want_residual.float()).abs() <= sum_bound).all()
    # The norm reads the kernel's own rounded sum: at most a rounding step or two of the output from torch's.
    assert ((normed.float() - want.float()).abs() <= (STEPS + 1) * one_step * want.float().abs().amax(-1, True)).all()
    hd = h.double() + delta.double()
    exact = w.double() * hd / hd.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
    assert ((normed.double() - exact).abs().max() / exact.abs().max()).item() < (STEPS + 2) * one_step


def test_add_rms_norm_on_the_cpu_is_torch_byte_for_byte():
    h, delta = torch.randn(2, 64).bfloat16(), torch.randn(2, 64).bfloat16()
    w = torch.rand(64).bfloat16()
    residual, normed = add_rms_norm(h, delta, w, 1e-6)
    assert torch.equal(residual, h + delta) and torch.equal(normed, rms_norm(h + delta, w, 1e-6))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_shared_gate_matches_torch_and_float64(dtype):
    routed, shared, x = rand((3, 192), 4, dtype), rand((3, 192), 5, dtype), rand((3, 192), 6, dtype)
    gate = rand((192,), 7, dtype, 0.1)
    got = shared_gate_triton(routed, shared, x, gate)
    want = (routed + shared * torch.sigmoid(x @ gate)[:, None])
    # Each of torch's ops rounds (the dot, the sigmoid, the product, the sum); the kernel rounds at the same
    # places, its dot summed in another order: within three rounding steps of the row's largest value.
    bound = (STEPS + 2) * ulp(dtype) * want.float().abs().amax(-1, True)
    assert ((got.float() - want.float()).abs() <= bound).all()
    xd = x.double()
    exact = routed.double() + shared.double() * torch.sigmoid(xd @ gate.double())[:, None]
    assert ((got.double() - exact).abs().max() / exact.abs().max()).item() < (STEPS + 3) * ulp(dtype)


def test_shared_gate_on_the_cpu_is_torch_byte_for_byte():
    routed, shared, x = (torch.randn(2, 64).bfloat16() for _ in range(3))
    gate = torch.randn(64).bfloat16()
    assert torch.equal(add_gated_shared(routed, shared, x, gate), routed + shared * torch.sigmoid(x @ gate)[:, None])


@pytest.mark.parametrize("cache_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("block", [1024, 32])
def test_store_kv_writes_what_index_copy_writes(cache_dtype, block):
    k, v = rand((2, 2, 48), 8, torch.bfloat16, 4), rand((2, 2, 48), 9, torch.bfloat16, 4)
    positions = torch.tensor([5, 2], device=DEVICE)
    want_k = torch.zeros(8, 2, 48, dtype=cache_dtype, device=DEVICE)
    want_v = torch.zeros_like(want_k)
    store_kv_ref(want_k, want_v, positions, k, v)
    got_k, got_v = torch.zeros_like(want_k), torch.zeros_like(want_v)
    store_kv_triton(got_k, got_v, positions.to(torch.int32), k, v, block=block)
    # bf16 -> bf16 copies, bf16 -> fp16 is exact in fp16's range: bit for bit.
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)
    assert not got_k[[0, 1, 3, 4, 6, 7]].any()  # no other cell touched


def test_route_topk_gives_int32_ids_when_asked():
    from strata.kernels.pointwise.route_topk import route_topk_triton

    logits = rand((2, 64), 10, torch.float32)
    weights, ids = route_topk_triton(logits, 4, True, torch.int32)
    want_w, want_ids = route_topk_triton(logits, 4, True)
    assert ids.dtype == torch.int32 and want_ids.dtype == torch.int64
    assert torch.equal(ids.long(), want_ids) and torch.equal(weights, want_w)


def test_rms_norm_reads_evenly_spaced_rows_in_place():
    """A query split off a [T, H, 2D] row (qwen3next's q and gate): normed without a copy, as the copy would be."""
    from strata.kernels.pointwise.rms_norm import rms_norm_triton

    both = rand((2, 3, 64), 11, torch.bfloat16)
    q = both.split(32, dim=-1)[0]
    assert not q.is_contiguous()
    w = rand((32,), 12, torch.bfloat16)
    assert torch.equal(rms_norm_triton(q, w, 1e-6), rms_norm_triton(q.contiguous(), w, 1e-6))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_decode_attention_reads_and_writes_the_activation_dtype(dtype):
    """q read in its own dtype (exact in fp32) and the output rounded in the merge: the fp32 result, rounded once,
    without the conversion launches before and after."""
    from strata.kernels.attention.decode import decode_attn_dense_triton

    keys, values = rand((40, 2, 64), 13, dtype), rand((40, 2, 64), 14, dtype)
    q, width = rand((2, 4, 64), 15, dtype), torch.tensor([9, 40], dtype=torch.int32, device=DEVICE)
    fp32 = decode_attn_dense_triton(q.float(), keys, values, width, 40, split=16)
    assert torch.equal(decode_attn_dense_triton(q, keys, values, width, 40, split=16), fp32)
    rounded = decode_attn_dense_triton(q, keys, values, width, 40, split=16, out_dtype=dtype)
    assert rounded.dtype == dtype
    # Compiled, the merge rounds to nearest as torch's .to does; the interpreter truncates: one step apart at most.
    bound = 0 if DEVICE == "cuda" else ulp(dtype) * fp32.abs()
    assert ((rounded.float() - fp32.to(dtype).float()).abs() <= bound).all()


@pytest.mark.parametrize("dim,n_rot", [(64, 64), (64, 32)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_qk_norm_rope_is_the_two_kernels_it_replaces(dim, n_rot, dtype):
    """Against torch (rms_norm then RoPE) and against float64; the query read in place from a [T, H, 2D] row."""
    from strata.kernels.pointwise.qk_norm_rope import qk_norm_rope_triton
    from strata.models.layers import Rope, qk_norm_rope

    q = rand((3, 4, 2 * dim), 16, dtype, 3).split(dim, dim=-1)[0]
    k = rand((3, 2, dim), 17, dtype, 3)
    qw = (1 + 0.1 * rand((dim,), 18, torch.float32)).to(dtype)
    kw = (1 + 0.1 * rand((dim,), 19, torch.float32)).to(dtype)
    cos, sin = Rope(n_rot, 1e6, torch.device(DEVICE)).cos_sin(torch.tensor([0, 9, 3000], device=DEVICE), dtype)
    got_q, got_k = qk_norm_rope_triton(q, k, qw, kw, 1e-6, cos, sin)
    want_q, want_k = qk_norm_rope(q.cpu(), k.cpu(), qw.cpu(), kw.cpu(), 1e-6, cos.cpu(), sin.cpu())  # torch
    one_step = ulp(dtype)
    for got, want, x, w in ((got_q, want_q, q, qw), (got_k, want_k, k, kw)):
        assert got.shape == want.shape and got.is_contiguous()
        # The norm may round one step apart (its sum's order), and RoPE's products and sum after it.
        bound = (STEPS + 2) * one_step * want.float().abs().amax(-1, True)
        assert ((got.float().cpu() - want.float()).abs() <= bound).all()
        xd = x.double().cpu()
        normed = w.double().cpu() * xd / xd.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
        c, s = cos.double().cpu()[:, None, :], sin.double().cpu()[:, None, :]
        half = n_rot // 2
        turned = torch.cat((-normed[..., half:n_rot], normed[..., :half]), dim=-1)
        exact = torch.cat((normed[..., :n_rot] * c + turned * s, normed[..., n_rot:]), dim=-1)
        assert ((got.double().cpu() - exact).abs().max() / exact.abs().max()).item() < (STEPS + 3) * one_step
