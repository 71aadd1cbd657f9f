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


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dense_cache_form_against_float64(dtype):
    from strata.kernels.attention.decode import decode_attn_dense_triton

    gen = torch.Generator().manual_seed(9)
    cells, n_kv, dim, span = 300, 2, 64, 256
    keys = torch.randn(cells, n_kv, dim, generator=gen).to(dtype)
    values = torch.randn(cells, n_kv, dim, generator=gen).to(dtype)
    q = torch.randn(3, 8, dim, generator=gen).to(dtype)
    width = torch.tensor([1, 77, 256])  # each query row reads cells 0..width-1 (a verify window's rows differ)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    got = decode_attn_dense_triton(q.to(device), keys.to(device), values.to(device), width.to(device), span,
                                   split=64).cpu().double()
    group = 8 // n_kv
    for i, w in enumerate(width.tolist()):
        k = keys[:w].double().repeat_interleave(group, dim=1)  # [w, H, D]
        v = values[:w].double().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,shd->hs", q[i].double(), k) / dim ** 0.5
        want = torch.einsum("hs,shd->hd", scores.softmax(-1), v)
        assert (got[i] - want).abs().max().item() <= 1e-5 * want.abs().max().item() + 1e-6
    with pytest.raises(ValueError, match="span"):
        decode_attn_dense_triton(q, keys, values, width, 512)


def test_dense_split_fills_the_gpu_on_short_spans_and_stays_whole_chunks():
    from strata.kernels.attention.decode import SPLIT, dense_split
    from strata.kernels.attention.prompt_parts import CHUNK

    assert dense_split(256, 4, 1) == CHUNK  # 8 programs at SPLIT: split down to whole chunks
    assert dense_split(32768, 4, 1) == SPLIT  # long spans: SPLIT cells a program
    for span in (256, 4096, 32768, 524288):
        split = dense_split(span, 2, 4)
        assert split % CHUNK == 0 and -(-span // split) <= 256  # the merge's width stays bounded
    from strata.kernels.attention.decode import dense_split_table

    spans = [1, 31, 256, 300, 4096, 5000, 32768, 524288]  # the table the static views read: dense_split's values
    for heads in (1, 4, 32):
        assert dense_split_table(torch.tensor(spans), heads).tolist() == [dense_split(s, heads, 1) for s in spans]


def test_a_window_row_is_its_own_one_query_launch_bit_for_bit(monkeypatch):
    """(Split-K, as the static views run it past the one-launch kernel's reach: short=None.) Issue 10: the rows of a verify window (one launch, each query taking the split of its own width through
    the step's table) equal one-query launches at each row's own captured span (span_for), whose splits differ
    (PROGRAMS at 4, as a GPU's 128 with 32 KV heads: 64 cells a program at a 256-cell span, 128 at 512): so the
    merge must not depend on the split count either."""
    from strata.engine import static_kv
    from strata.kernels.attention import decode

    monkeypatch.setattr(decode, "PROGRAMS", 4)
    monkeypatch.setattr(static_kv, "_SPLIT_TABLES", {})
    gen = torch.Generator().manual_seed(11)
    cells, n_kv, dim = 512, 1, 16
    keys = torch.randn(cells, n_kv, dim, generator=gen).to(torch.bfloat16)
    values = torch.randn(cells, n_kv, dim, generator=gen).to(torch.bfloat16)
    q = torch.randn(4, 2 * n_kv, dim, generator=gen).to(torch.bfloat16)
    width = torch.tensor([255, 256, 257, 258])  # rows on both sides of a span boundary
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the GPU runs the compiled kernels (a device script)
    keys, values, q, width = (t.to(device) for t in (keys, values, q, width))
    assert decode.dense_split(256, n_kv, 1) == 64 and decode.dense_split(512, n_kv, 1) == 128
    table, host = static_kv.split_table(n_kv, cells, exact=False, device=torch.device(device))
    n_splits = int(((torch.arange(1, 513) + host[1:] - 1) // host[1:]).max())
    window = decode.decode_attn_dense_triton(q, keys, values, width, 512, out_dtype=torch.float32,
                                             row_split=(table, n_splits))
    for r, w in enumerate(width.tolist()):
        one = decode.decode_attn_dense_triton(q[r:r + 1], keys, values, width[r:r + 1],
                                              static_kv.span_for(w, cells), out_dtype=torch.float32, short=None)
        assert torch.equal(window[r:r + 1], one)
    # Without the table every row would take the launch's one split (128 here): row 0's own step takes 64.
    shared = decode.decode_attn_dense_triton(q, keys, values, width, 512, out_dtype=torch.float32, short=None)
    assert torch.equal(shared[2:], window[2:]) and not torch.equal(shared[:2], window[:2])
