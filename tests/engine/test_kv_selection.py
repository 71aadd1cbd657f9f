"""`selection=(ids, width)` through the KV backends: a full causal selection is the dense path, byte for byte; a
sparse one is attention over exactly the selected cells (float64 references)."""

from __future__ import annotations

import math

import pytest
import torch

from strata.engine.hybrid_cache import HybridCache
from strata.engine.kv import KVCache, new_kv_cache
from strata.engine.kv_paged import PagedInt8KV
from strata.errors import StrataError
from strata.kernels.attention.prompt_ref import prompt_attn_ref
from tests.kernels import DEVICE

CPU = torch.device("cpu")
STEPS = ((0, 13), (13, 14), (14, 21))  # a prompt chunk, a decode step, another chunk


def _causal(start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.arange(end, dtype=torch.int32).expand(end - start, end).clone()
    return ids, torch.arange(start + 1, end + 1, dtype=torch.int32)


def _sparse(start: int, end: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per query a random ascending subset of its causal cells (sometimes none), padded with -1."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.full((end - start, end), -1, dtype=torch.int32)
    width = torch.zeros(end - start, dtype=torch.int32)
    for i in range(end - start):
        keep = torch.nonzero(torch.rand(start + i + 1, generator=g) < 0.4).flatten()
        if i == 1:
            keep = keep[:0]  # an empty selection attends to nothing: output 0
        ids[i, : len(keep)], width[i] = keep.int(), len(keep)
    return ids, width


def _data(seed: int, n: int = 21, heads: int = 4, kv_heads: int = 2, dim: int = 64):
    torch.manual_seed(seed)
    return torch.randn(n, heads, dim), torch.randn(n, kv_heads, dim), torch.randn(n, kv_heads, dim)


def _run(cache, q, k, v, selections=None, layer=0):
    outs = []
    for n, (start, end) in enumerate(STEPS):
        cache.reserve(end)
        sel = None if selections is None else selections[n]
        outs.append(cache.attend(layer, q[start:end], k[start:end], v[start:end], start, sel))
    return torch.cat(outs)


def _attention_f64(q, keys, values, ids, width):
    """Each query over its selected rows of keys/values [S, Hkv, D], in float64."""
    group = q.shape[1] // keys.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for i in range(q.shape[0]):
        cells = ids[i, : width[i]].long()
        if len(cells):
            k = keys[cells].double().repeat_interleave(group, 1)
            v = values[cells].double().repeat_interleave(group, 1)
            p = torch.softmax(torch.einsum("hd,chd->hc", q[i].double(), k) / math.sqrt(q.shape[2]), -1)
            out[i] = torch.einsum("hc,chd->hd", p, v)
    return out


@pytest.mark.parametrize("kind", ["float32", "float16", "int8"])
def test_a_full_causal_selection_gives_the_dense_bytes(kind):
    q, k, v = _data(0)
    dense = _run(new_kv_cache(kind, 1, 2, 64, 32, CPU), q, k, v)
    selected = _run(new_kv_cache(kind, 1, 2, 64, 32, CPU), q, k, v, [_causal(s, e) for s, e in STEPS])
    assert torch.equal(dense, selected)


def test_the_dense_cache_attends_only_the_selected_cells():
    q, k, v = _data(1)
    selections = [_sparse(s, e, n) for n, (s, e) in enumerate(STEPS)]
    out = _run(KVCache(1, 2, 64, 32, torch.float32, CPU), q, k, v, selections)
    for (start, end), (ids, width) in zip(STEPS, selections):
        want = _attention_f64(q[start:end], k, v, ids, width)
        assert (out[start:end].double() - want).abs().max() < 1e-5  # float32 SDPA against float64
    assert torch.count_nonzero(out[1]) == 0  # query 1's selection is empty


def test_the_int8_cache_attends_only_the_selected_cells():
    q, k, v = _data(2)
    selections = [_sparse(s, e, 10 + n) for n, (s, e) in enumerate(STEPS)]
    cache = PagedInt8KV(1, 2, 64, 32, CPU, initial_tokens=8)
    out = _run(cache, q, k, v, selections)
    for (start, end), (ids, width) in zip(STEPS, selections):
        want = prompt_attn_ref(q[start:end], cache.pools[0], cache.page_table, ids, width)  # float64
        assert (out[start:end].double() - want).abs().max() < 1e-5
    assert torch.count_nonzero(out[1]) == 0


def test_the_int8_kernels_take_the_selection_alike():
    """Prompt and decode Triton kernels (interpreted here) against the torch reference, same selections."""
    q, k, v = (x.to(DEVICE) for x in _data(3))
    selections = [tuple(t.to(DEVICE) for t in _sparse(s, e, 20 + n)) for n, (s, e) in enumerate(STEPS)]
    outs = [_run(PagedInt8KV(1, 2, 64, 32, torch.device(DEVICE), initial_tokens=8, kernels=kernels), q, k, v,
                 selections) for kernels in (False, True)]
    assert (outs[0] - outs[1]).abs().max() < 1e-5


def test_the_hybrid_cache_passes_the_selection_on():
    q, k, v = _data(4)
    cache = HybridCache((True, False), 2, 64, (3, 8), (2, 4, 4), 32, "float32", torch.float32, CPU)
    ids, width = _sparse(0, 13, 5)
    cache.begin(0, 13)
    out = cache.attend(1, q[:13], k[:13], v[:13], 0, (ids, width))
    assert (out.double() - _attention_f64(q[:13], k, v, ids, width)).abs().max() < 1e-5


def test_a_selection_of_the_wrong_shape_is_one_clear_error():
    q, k, v = _data(5)
    cache = KVCache(1, 2, 64, 32, torch.float32, CPU)
    cache.reserve(4)
    with pytest.raises(StrataError, match=r"selection ids \[3, 4\] / width \[3\] do not fit a step of 4 queries"):
        cache.attend(0, q[:4], k[:4], v[:4], 0, (torch.zeros(3, 4, dtype=torch.int32),
                                                  torch.zeros(3, dtype=torch.int32)))
