"""Decode attention (split-K + merge) against the fp32 prompt kernel and float64."""

import pytest
import torch

from strata.kernels.attention.decode import decode_attn_triton
from strata.kernels.attention.prompt_fp32 import prompt_attn_fp32
from strata.kernels.attention.prompt_ref import prompt_attn_ref
from tests.kernels.attention.common import queries, random_pool, selections


@pytest.mark.parametrize("int8", [True, False])
def test_decode_equals_prompt_kernel(int8):
    pool, table = random_pool(300, 2, 128, int8, seed=3)
    ids, width = selections([0, 33, 150, 299], cap=100, seed=3)
    q = queries(4, 8, 128, seed=3)
    fp32 = prompt_attn_fp32(q, pool, table, ids, width)
    one_split = decode_attn_triton(q, pool, table, ids, width, split=128)  # cap 100: one split, same order
    assert torch.equal(one_split.view(torch.int32), fp32.view(torch.int32))
    split = decode_attn_triton(q, pool, table, ids, width, split=32)
    ref = prompt_attn_ref(q, pool, table, ids, width)
    scale = ref.abs().max().item()
    err_fp32 = (fp32.double() - ref).abs().max().item()
    assert (split.double() - ref).abs().max().item() <= max(4 * err_fp32, 1e-6 * scale)
    assert (split - fp32).abs().max().item() <= 1e-4 * scale
