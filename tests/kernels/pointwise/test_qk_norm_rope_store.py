"""q/k norm + RoPE + the KV write in one launch: the same bytes as the kernels it replaces (qk_norm_rope_triton,
then store_kv_triton or append_kv_triton), which test_fused_step_kernels.py / test_kv_int8.py hold against torch and
float64."""

import pytest
import torch

from strata.kernels.attention.kv_int8 import append_kv_triton
from strata.kernels.attention.paged import PagedKV
from strata.kernels.pointwise.qk_norm_rope import qk_norm_rope_triton
from strata.kernels.pointwise.qk_norm_rope_store import qk_norm_rope_store_dense, qk_norm_rope_store_paged
from strata.kernels.pointwise.store_kv import store_kv_triton
from strata.models.layers import Rope
from tests.kernels.pointwise.common import DEVICE, rand


def _inputs(dim, n_rot, dtype, n_tokens=3):
    """q split off a [T, H, 2D] row (qwen3next's gate beside it), k and v views of one stacked projection."""
    q = rand((n_tokens, 4, 2 * dim), 21, dtype, 3).split(dim, dim=-1)[0]
    kv = rand((n_tokens, 2 * 2 * dim), 22, dtype, 3)
    k, v = (t.view(n_tokens, 2, dim) for t in kv.split(2 * dim, dim=-1))
    qw = (1 + 0.1 * rand((dim,), 23, torch.float32)).to(dtype)
    kw = (1 + 0.1 * rand((dim,), 24, torch.float32)).to(dtype)
    positions = torch.tensor([7, 0, 30][:n_tokens], device=DEVICE)
    cos, sin = Rope(n_rot, 1e6, torch.device(DEVICE)).cos_sin(positions * 101, dtype)
    return q, k, v, qw, kw, cos, sin, positions


@pytest.mark.parametrize("dim,n_rot", [(64, 64), (128, 128), (128, 64)])
@pytest.mark.parametrize("dtype,cache_dtype", [(torch.bfloat16, torch.float16), (torch.float16, torch.float16),
                                               (torch.bfloat16, torch.float32)])
def test_dense_cache_gets_the_bytes_of_the_two_kernels(dim, n_rot, dtype, cache_dtype):
    q, k, v, qw, kw, cos, sin, positions = _inputs(dim, n_rot, dtype)
    want_keys, want_values = (torch.full((32, 2, dim), 0.5, dtype=cache_dtype, device=DEVICE) for _ in range(2))
    got_keys, got_values = want_keys.clone(), want_values.clone()
    want_q, turned_k = qk_norm_rope_triton(q, k, qw, kw, 1e-6, cos, sin)
    store_kv_triton(want_keys, want_values, positions.to(torch.int32), turned_k, v)
    got_q = qk_norm_rope_store_dense(q, k, v, qw, kw, 1e-6, cos, sin, got_keys, got_values, positions.to(torch.int32))
    assert got_q.is_contiguous() and torch.equal(got_q, want_q)
    assert torch.equal(got_keys, want_keys) and torch.equal(got_values, want_values)


@pytest.mark.parametrize("int8", [True, False])
@pytest.mark.parametrize("n_rot", [128, 64])
def test_paged_pool_gets_the_bytes_of_the_two_kernels(int8, n_rot):
    q, k, v, qw, kw, cos, sin, positions = _inputs(128, n_rot, torch.bfloat16)
    table = torch.tensor([5, 2, 7, 0, 1, 3, 6, 4, 8], dtype=torch.int32, device=DEVICE)
    want = PagedKV.empty(9, 2, 128, int8=int8, device=DEVICE)
    got = PagedKV.empty(9, 2, 128, int8=int8, device=DEVICE)
    want_q, turned_k = qk_norm_rope_triton(q, k, qw, kw, 1e-6, cos, sin)
    append_kv_triton(want, table, positions.to(torch.int32), turned_k, v)
    got_q = qk_norm_rope_store_paged(q, k, v, qw, kw, 1e-6, cos, sin, got, table, positions.to(torch.int32))
    assert torch.equal(got_q, want_q)
    for name in ("k", "v", "k_scale", "v_scale"):
        if getattr(want, name) is not None:
            assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert got.k.abs().sum() > 0  # something was written


def test_a_dense_cache_of_other_rows_is_refused():
    q, k, v, qw, kw, cos, sin, positions = _inputs(64, 64, torch.bfloat16)
    keys = torch.zeros(8, 4, 64, dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match="cannot take"):
        qk_norm_rope_store_dense(q, k, v, qw, kw, 1e-6, cos, sin, keys, keys.clone(), positions)
