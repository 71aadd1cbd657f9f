"""The one-launch decode attention for short spans (decode_short.py) against float64 and the split-K kernel.

Bound, stated once: within max(4 x the fp32 split-K kernel's error, 1e-5 x the output's largest value) of the
float64 reference (the interpreter computes in fp32; compiled, QK in tf32 is exact for fp16/bf16 inputs and tf32x3
holds ~fp32 accuracy, 2^-22 a product before the tensor cores' fp32 sums; the step rounds the output to bf16, 2^-9),
plus, over a fp16 cache (both dots native by default: the probabilities rounded to fp16), 2^-11 x the values'
largest magnitude (as its sum of probabilities is 1), doubled for the fp32 sums around it; over int8 codes (native
by default: the values, codes times scales, rounded to fp16 as well) three times that.
"""

import dataclasses

import pytest
import torch

from strata import switches
from strata.kernels.attention import decode_short
from strata.kernels.attention.decode import decode_attn_dense_triton, decode_attn_triton, dense_split
from strata.kernels.attention.decode_short import ShortConfig
from strata.kernels.attention.prompt_ref import prompt_attn_ref
from tests.kernels import DEVICE
from tests.kernels.attention.common import queries, random_pool, selections

SMALL = ShortConfig(cells=32, max_splits=4, chunk=16)  # tiny spans still split 1, 2 and 4 ways


def _dense_float64(q, keys, values, width):
    n_q, n_heads, dim = q.shape
    group = n_heads // keys.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for i, w in enumerate(width.tolist()):
        k = keys[:w].double().cpu().repeat_interleave(group, dim=1)
        v = values[:w].double().cpu().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,shd->hs", q[i].double().cpu(), k) / dim ** 0.5
        out[i] = torch.einsum("hs,shd->hd", scores.softmax(-1), v) if w else 0.0
    return out


def _within(got, want, split_k, values=None, pool=None):
    """`values`: the cache's values where the default's dots are native (a fp16 cache); `pool`: an int8 pool, its
    values (codes times scales) rounded to fp16 as well for the native PV dot."""
    scale = want.abs().max().item()
    bound = max(4 * (split_k.double().cpu() - want).abs().max().item(), 1e-5 * scale)
    if values is not None and values.dtype == torch.float16:
        bound += 2 * 2.0**-11 * values.float().abs().max().item()
    if pool is not None and pool.int8:
        bound += 3 * 2.0**-11 * _int8_values(pool).abs().max().item()
    return (got.double().cpu() - want).abs().max().item() <= bound


def _int8_values(pool):
    """An int8 pool's values: each code times its (cell, 64 values) scale."""
    rows, dim = pool.v.shape
    return (pool.v.float().view(rows, dim // 64, 64) * pool.v_scale.float()[:, :, None]).view(rows, dim).cpu()


@pytest.mark.parametrize("span,dtype,by_span", [  # SMALL: 1, 2 and 4 programs per (KV head, query)
    (16, torch.float16, True), (64, torch.bfloat16, True), (64, torch.float16, False), (128, torch.float16, True),
    (128, torch.bfloat16, False)])
def test_dense_form_against_float64(span, dtype, by_span):
    gen = torch.Generator().manual_seed(span)
    keys = (torch.randn(160, 2, 64, generator=gen) * 1.5).to(dtype).to(DEVICE)
    values = torch.randn(160, 2, 64, generator=gen).to(dtype).to(DEVICE)
    q = (torch.randn(4, 8, 64, generator=gen) * 2).to(dtype).to(DEVICE)
    keys[span:] = values[span:] = float("nan")  # past the span: never read
    width = torch.tensor([0, 1, span // 2 + 3, span], device=DEVICE).clamp(max=span)  # a window's rows differ
    config = dataclasses.replace(SMALL, by_span=by_span)
    got = decode_attn_dense_triton(q, keys, values, width, span, short=config)
    split_k = decode_attn_dense_triton(q, keys, values, width, span, split=16)
    want = _dense_float64(q, keys, values, width)
    assert _within(got, want, split_k, values[:span])
    assert got[0].abs().max().item() == 0  # no cells: zeros, as the split-K kernel gives
    assert torch.equal(got, decode_attn_dense_triton(q, keys, values, width, span, short=config))  # the same bytes


@pytest.mark.parametrize("by_span", [True, False])
def test_cells_past_the_width_change_nothing(by_span):
    """By span, a program loads its whole share before it knows the width: what lies past it (here NaN) is masked."""
    gen = torch.Generator().manual_seed(11)
    keys, values = (torch.randn(64, 2, 64, generator=gen).half().to(DEVICE) for _ in range(2))
    q, width = torch.randn(1, 4, 64, generator=gen).half().to(DEVICE), torch.tensor([37], device=DEVICE)
    config = dataclasses.replace(SMALL, by_span=by_span)
    clean = decode_attn_dense_triton(q, keys, values, width, 64, short=config)
    keys[37:], values[37:] = float("nan"), float("inf")
    assert torch.equal(decode_attn_dense_triton(q, keys, values, width, 64, short=config), clean)


def test_native_dots_within_the_half_precision_bound():
    """"native" (the default over a fp16 cache): q and P rounded to its dtype, 2^-11 relative each: within 2e-3 of the
    output's largest value."""
    gen = torch.Generator().manual_seed(4)
    keys, values = (torch.randn(128, 2, 64, generator=gen).half().to(DEVICE) for _ in range(2))
    q, width = torch.randn(2, 8, 64, generator=gen).bfloat16().to(DEVICE), torch.tensor([77, 128], device=DEVICE)
    want = _dense_float64(q, keys, values, width)
    for by_span in (True, False):
        config = dataclasses.replace(SMALL, qk="native", pv="native", by_span=by_span)
        got = decode_attn_dense_triton(q, keys, values, width, 128, short=config)
        assert (got.double().cpu() - want).abs().max().item() <= 2e-3 * want.abs().max().item()


def test_the_default_dots_follow_the_cache():
    """Native (one fp16 pass, chunks of 64) over fp16 and int8 caches (a half-precision query); over a bf16 cache QK
    in tf32 (exact) and PV in tf32x3; over a float32 cache tf32x3 both; a config's own choice stands."""
    from strata.kernels.attention.decode_short import DEFAULT, precisions

    q = torch.zeros(1, 2, 64, dtype=torch.bfloat16, device=DEVICE)
    assert precisions(q, torch.float16, DEFAULT) == ("native", "native")
    assert precisions(q, torch.bfloat16, DEFAULT) == ("tf32", "tf32x3")
    assert precisions(q, torch.int8, DEFAULT) == ("native", "native")
    assert precisions(q.float(), torch.float32, DEFAULT) == precisions(q.float(), torch.int8, DEFAULT) == (
        "tf32x3", "tf32x3")
    assert precisions(q, torch.float16, dataclasses.replace(DEFAULT, pv="tf32x3")) == ("native", "tf32x3")
    # over int8 codes native takes both dots or neither
    assert precisions(q, torch.int8, dataclasses.replace(DEFAULT, pv="tf32x3")) == ("tf32x3", "tf32x3")
    assert DEFAULT.cells_a_step(True) == 64 and DEFAULT.cells_a_step(False) == 32


@pytest.mark.parametrize("int8", [True, False])
def test_paged_selection_against_float64(int8):
    pool, table = random_pool(300, 2, 128, int8, seed=5)
    ids, width = selections([0, 40, 150, 299], cap=128, seed=5)
    q = queries(4, 8, 128, seed=5).bfloat16()
    config = ShortConfig(cells=32, max_splits=4, chunk=32)
    got = decode_attn_triton(q, pool, table, ids, width, short=config)
    split_k = decode_attn_triton(q, pool, table, ids, width, split=32)
    assert _within(got, prompt_attn_ref(q.float(), pool, table, ids, width).cpu(), split_k, pool.v, pool)


@pytest.mark.parametrize("dim", [64, 128, 256])
def test_int8_native_dots_against_float64(dim):
    """Over int8 codes the native form (one fp16 QK dot per 64 values, scaled after; V's codes times scales rounded
    to fp16) holds the bound, as does the tf32x3 form over codes scaled in fp32, for one to four groups of 64."""
    pool, table = random_pool(200, 2, dim, True, seed=dim)
    ids, width = selections([0, 63, 130, 199], cap=160, seed=dim)
    q = queries(4, 8, dim, seed=dim).bfloat16()
    want = prompt_attn_ref(q.float(), pool, table, ids, width).cpu()
    split_k = decode_attn_triton(q, pool, table, ids, width, split=32)
    for dots in ("native", "tf32x3"):
        config = ShortConfig(cells=32, max_splits=4, qk=dots, pv=dots)
        got = decode_attn_triton(q, pool, table, ids, width, short=config)
        assert _within(got, want, split_k, pool=pool if dots == "native" else None), dots


def test_cells_in_order_give_the_loaded_ids_bytes():
    """`in_order` (the static view's ids 0, 1, 2, ...: the kernel takes cell j as j) reads the same rows in the same
    order as loading those ids: the same bytes; a selection that is not in order is not what it computes."""
    pool, table = random_pool(200, 2, 128, True, seed=8)
    q, width = queries(3, 8, 128, seed=8).bfloat16(), torch.tensor([1, 70, 200], device=DEVICE)
    ids = torch.arange(200, dtype=torch.int32, device=DEVICE)[None].expand(3, 200)
    loaded = decode_attn_triton(q, pool, table, ids, width, short=SMALL)
    assert torch.equal(decode_attn_triton(q, pool, table, ids, width, short=SMALL, in_order=True), loaded)
    reversed_ids = ids.flip(-1).contiguous()
    assert not torch.equal(decode_attn_triton(q, pool, table, reversed_ids, width, short=SMALL), loaded)


def test_every_int8_code_becomes_its_fp16_value():
    import triton
    import triton.language as tl

    @triton.jit
    def convert(codes_ptr, out_ptr):
        i = tl.arange(0, 256)
        tl.store(out_ptr + i, decode_short._codes_as_fp16(tl.load(codes_ptr + i)))

    codes = torch.arange(-128, 128, dtype=torch.int8, device=DEVICE)
    out = torch.empty(256, dtype=torch.float16, device=DEVICE)
    convert[(1,)](codes, out)
    assert torch.equal(out, codes.half())


@pytest.mark.parametrize("dtype,half", [(torch.bfloat16, 32), (torch.float16, 16)])  # RoPE over all / part of D
def test_the_turned_launch_gives_the_two_launches_results(dtype, half):
    """STRATA_DECODE_TURN (decode_turn.py): raw q, k, v turned inside the launch, four programs a KV head, the new cell
    in the third (which stores it and reads it back): the output and the stored key and value as the store launch
    then the attention give them (the same bytes under the interpreter; compiled, each row's norm is summed in
    another order: a step of the dtype)."""
    from strata.kernels.attention.decode_turn import Turn
    from strata.kernels.pointwise.qk_norm_rope_store import qk_norm_rope_store_dense
    from strata.models.layers import Rope

    gen = torch.Generator().manual_seed(half)
    heads, kv_heads, dim, span, pos = 8, 2, 64, 64, 40
    qkv = (torch.randn(1, (heads + 2 * kv_heads) * dim, generator=gen) * 3).to(dtype).to(DEVICE)
    q, k, v = (qkv[:, a * dim:b * dim].view(1, b - a, dim) for a, b in
               ((0, heads), (heads, heads + kv_heads), (heads + kv_heads, heads + 2 * kv_heads)))
    qw, kw = ((1 + 0.1 * torch.randn(dim, generator=gen)).to(dtype).to(DEVICE) for _ in range(2))
    positions = torch.tensor([pos], dtype=torch.int32, device=DEVICE)
    cos, sin = Rope(2 * half, 1e6, torch.device(DEVICE)).cos_sin(positions, dtype)
    keys = torch.randn(span, kv_heads, dim, generator=gen).half().to(DEVICE)
    values = torch.randn(span, kv_heads, dim, generator=gen).half().to(DEVICE)
    keys[pos:] = values[pos:] = float("nan")  # the new cell until stored, and cells past it (never read)
    turned_keys, turned_values = keys.clone(), values.clone()
    config = ShortConfig(cells=16, max_splits=4)
    normed = qk_norm_rope_store_dense(q, k, v, qw, kw, 1e-6, cos, sin, keys, values, positions)
    want = decode_attn_dense_triton(normed, keys, values, positions + 1, span, short=config)
    got = decode_attn_dense_triton(q, turned_keys, turned_values, positions + 1, span, short=config,
                                   turn=Turn(k, v, qw, kw, cos, sin, 1e-6))
    step = 0 if DEVICE == "cpu" else 2.0**-8
    assert torch.allclose(turned_keys[pos], keys[pos], rtol=step, atol=0)
    assert torch.equal(turned_values[pos], values[pos])
    assert (got - want).abs().max().item() <= (1e-6 if DEVICE == "cpu" else 2e-2) * want.abs().max().item()
    assert decode_attn_dense_triton(torch.cat([q, q]), turned_keys, turned_values, positions.repeat(2) + 1, span,
                                    short=config, turn=Turn(k, v, qw, kw, cos, sin, 1e-6)) is None  # two rows


@pytest.mark.parametrize("int8", [True, False])
def test_the_turned_launch_into_the_paged_pool(int8):
    """STRATA_DECODE_TURN over the paged pool (cells in order; int8 codes and scales, or fp16): the owning program
    quantizes and stores the new key and value as the store launch does; the output as that launch then the
    attention give it."""
    from strata.kernels.attention.decode_turn import Turn
    from strata.kernels.pointwise.qk_norm_rope_store import qk_norm_rope_store_paged
    from strata.models.layers import Rope

    gen = torch.Generator().manual_seed(int(int8))
    heads, kv_heads, dim, cells, pos = 8, 2, 128, 96, 70
    pool, table = random_pool(cells, kv_heads, dim, int8, seed=9)
    turned_pool = type(pool)(*(None if t is None else t.clone() for t in (pool.k, pool.v, pool.k_scale, pool.v_scale)),
                             kv_heads)
    qkv = (torch.randn(1, (heads + 2 * kv_heads) * dim, generator=gen) * 3).bfloat16().to(DEVICE)
    q, k, v = (qkv[:, a * dim:b * dim].view(1, b - a, dim) for a, b in
               ((0, heads), (heads, heads + kv_heads), (heads + kv_heads, heads + 2 * kv_heads)))
    qw, kw = ((1 + 0.1 * torch.randn(dim, generator=gen)).bfloat16().to(DEVICE) for _ in range(2))
    positions = torch.tensor([pos], dtype=torch.int32, device=DEVICE)
    cos, sin = Rope(dim, 1e6, torch.device(DEVICE)).cos_sin(positions, torch.bfloat16)
    ids = torch.arange(cells, dtype=torch.int32, device=DEVICE)[None]
    config = ShortConfig(cells=32, max_splits=4)
    normed = qk_norm_rope_store_paged(q, k, v, qw, kw, 1e-6, cos, sin, pool, table, positions)
    want = decode_attn_triton(normed, pool, table, ids, positions + 1, short=config, in_order=True)
    got = decode_attn_triton(q, turned_pool, table, ids, positions + 1, short=config, in_order=True,
                             turn=Turn(k, v, qw, kw, cos, sin, 1e-6))
    if DEVICE == "cpu":  # compiled, a norm summed in another order may move a code or a scale by a step
        for a, b in zip((pool.k, pool.v, pool.k_scale, pool.v_scale), (turned_pool.k, turned_pool.v,
                                                                       turned_pool.k_scale, turned_pool.v_scale)):
            assert a is None or torch.equal(a, b)
    assert (got - want).abs().max().item() <= (1e-6 if DEVICE == "cpu" else 2e-2) * want.abs().max().item()
    assert decode_attn_triton(q, turned_pool, table, ids, positions + 1, short=config,
                              turn=Turn(k, v, qw, kw, cos, sin, 1e-6)) is None  # cells not known to be in order


def test_counters_are_left_zero_for_the_next_launch():
    keys, values = (torch.randn(64, 2, 64).half().to(DEVICE) for _ in range(2))
    q, width = torch.randn(3, 4, 64).half().to(DEVICE), torch.tensor([5, 33, 64], device=DEVICE)
    first = decode_attn_dense_triton(q, keys, values, width, 64, short=SMALL)
    counters = decode_short.arrival_counters(first.device, 1)  # the device's own (cuda:0, not "cuda")
    assert counters.abs().sum().item() == 0
    assert torch.equal(decode_attn_dense_triton(q, keys, values, width, 64, short=SMALL), first)


def test_output_in_the_activation_dtype_is_the_fp32_result_rounded_once():
    gen = torch.Generator().manual_seed(3)
    keys, values = (torch.randn(96, 2, 64, generator=gen).bfloat16().to(DEVICE) for _ in range(2))
    q, width = torch.randn(2, 4, 64, generator=gen).bfloat16().to(DEVICE), torch.tensor([7, 96], device=DEVICE)
    fp32 = decode_attn_dense_triton(q, keys, values, width, 96, short=SMALL)
    rounded = decode_attn_dense_triton(q, keys, values, width, 96, short=SMALL, out_dtype=torch.bfloat16)
    # Compiled, the store rounds to nearest as torch's .to does; the interpreter truncates: one step apart at most.
    bound = 0 if DEVICE == "cuda" else 2.0 ** -7 * fp32.abs()
    assert ((rounded.float() - fp32.to(torch.bfloat16).float()).abs() <= bound).all()


def test_split_choice_follows_the_span_and_long_spans_keep_split_k():
    config = ShortConfig(cells=64, max_splits=16, max_span=1024)
    assert [config.splits(s) for s in (64, 256, 512, 1024, 2048)] == [1, 4, 8, 16, 16]
    assert config.per_program(1024, 32) == 64 and config.per_program(2048, 32) == 128  # past cells x max_splits
    assert config.per_program(256, 64) == 64 and config.per_program(128, 64) == 64  # whole chunks
    assert config.cells_a_step(True) == 64 and config.cells_a_step(False) == 32  # auto: 64 where both are native
    assert config.takes(1024) and not config.takes(2048)
    keys, values = (torch.randn(256, 1, 64).half().to(DEVICE) for _ in range(2))
    q, width = torch.randn(1, 2, 64).half().to(DEVICE), torch.tensor([200], device=DEVICE)
    split_k = decode_attn_dense_triton(q, keys, values, width, 256, split=dense_split(256, 1, 1))
    # Past the config's reach, and under the switch, the call is the split-K kernel's, byte for byte.
    assert torch.equal(decode_attn_dense_triton(q, keys, values, width, 256, short=ShortConfig(max_span=128)), split_k)
    with switches.override(STRATA_DECODE_ATTN_SPLITK=True):
        assert torch.equal(decode_attn_dense_triton(q, keys, values, width, 256), split_k)


def test_a_config_that_fails_to_compile_falls_back_to_split_k(monkeypatch, capsys):
    class Broken:
        def __getitem__(self, grid):
            def launch(*args, **meta):
                raise RuntimeError("ptxas: out of registers\nmore")
            return launch

    monkeypatch.setattr(decode_short, "_decode_short_kernel", Broken())
    monkeypatch.setattr(decode_short, "_compiled", set())
    monkeypatch.setattr(decode_short, "_failed", set())
    keys, values = (torch.randn(64, 2, 64).half().to(DEVICE) for _ in range(2))
    q, width = torch.randn(1, 4, 64).half().to(DEVICE), torch.tensor([50], device=DEVICE)
    split_k = decode_attn_dense_triton(q, keys, values, width, 64, split=dense_split(64, 2, 1))
    for _ in range(2):
        assert torch.equal(decode_attn_dense_triton(q, keys, values, width, 64, short=SMALL), split_k)
    err = capsys.readouterr().err
    assert err.count("failed to compile (ptxas: out of registers)") == 1


@pytest.mark.parametrize("short", [ShortConfig(cells=32, max_splits=2), None])
def test_an_expanded_ids_row_is_read_in_place(short):
    """The static paged view's ids: one row expanded over the queries (stride 0), read without a copy."""
    pool, table = random_pool(64, 2, 64, True, seed=6)
    q, width = queries(3, 4, 64, seed=6), torch.tensor([10, 40, 64], dtype=torch.int32, device=DEVICE)
    expanded = torch.arange(64, dtype=torch.int32, device=DEVICE)[None].expand(3, 64)
    got = decode_attn_triton(q, pool, table, expanded, width, short=short)
    assert torch.equal(got, decode_attn_triton(q, pool, table, expanded.contiguous(), width, short=short))


def test_a_window_row_is_its_own_one_query_launch_bit_for_bit():
    """Issue 10: a row's programs share its cells by its width alone, so a window's rows (one launch at the
    window's span) equal one-query launches at each row's own span (span_for: 256 or 512 here, 4 or 8 programs)."""
    from strata.engine.static_kv import span_for

    gen = torch.Generator().manual_seed(12)
    keys, values = (torch.randn(512, 1, 64, generator=gen).bfloat16().to(DEVICE) for _ in range(2))
    q = torch.randn(4, 2, 64, generator=gen).bfloat16().to(DEVICE)
    width = torch.tensor([255, 256, 257, 258], device=DEVICE)
    config = ShortConfig()
    window = decode_attn_dense_triton(q, keys, values, width, 512, out_dtype=torch.float32, short=config)
    for r, w in enumerate(width.tolist()):
        one = decode_attn_dense_triton(q[r:r + 1], keys, values, width[r:r + 1], span_for(w, 512),
                                       out_dtype=torch.float32, short=config)
        assert torch.equal(window[r:r + 1], one)


@pytest.mark.parametrize("exact", [False, True])
def test_a_window_across_the_reach_takes_each_rows_own_kernel(monkeypatch, exact):
    """A window whose rows' own steps ran on both sides of the one-launch kernel's reach (here 256 cells): each row
    equals its one-token step through the static view, the one launch below the reach, split-K past it."""
    from strata.engine import static_kv
    from strata.engine.kv import KVCache

    monkeypatch.setattr(static_kv, "SHORT_DEFAULT", ShortConfig(cells=64, max_span=256))  # not split-K's 32
    monkeypatch.setattr(static_kv, "_SPLIT_TABLES", {})
    cache = KVCache(1, 1, 16, 512, torch.float16, torch.device(DEVICE), initial_tokens=512)
    gen = torch.Generator().manual_seed(13)
    cache.keys[0].copy_(torch.randn(512, 1, 16, generator=gen))
    cache.values[0].copy_(torch.randn(512, 1, 16, generator=gen))
    q = torch.randn(4, 2, 16, generator=gen).to(DEVICE)  # float32 out: no bf16 rounding to hide a difference
    positions = torch.arange(253, 257, device=DEVICE)  # widths 254..257: two rows each side
    span = 257 if exact else 512
    window = static_kv.StaticDenseKV(cache, positions, span, exact)._decode(0, q, (positions + 1).int())
    for r in range(4):
        own_span = 254 + r if exact else static_kv.span_for(254 + r, 512)
        one = static_kv.StaticDenseKV(cache, positions[r:r + 1], own_span, exact)
        assert torch.equal(window[r:r + 1], one._decode(0, q[r:r + 1], (positions[r:r + 1] + 1).int()))


def test_a_paged_window_across_the_reach_takes_each_rows_own_kernel(monkeypatch):
    """As above over the int8 pool (split-K's split is fixed there)."""
    from strata.engine import static_kv
    from strata.engine.kv_paged import PagedInt8KV
    from strata.kernels.attention.kv_int8 import append_kv_ref

    monkeypatch.setattr(static_kv, "SHORT_DEFAULT", ShortConfig(cells=64, max_span=256))
    cache = PagedInt8KV(1, 1, 64, 512, torch.device(DEVICE), initial_tokens=512, kernels=True)
    cache.reserve(512)
    gen = torch.Generator().manual_seed(14)
    cells = torch.arange(512, device=DEVICE)
    append_kv_ref(cache.pools[0], cache.page_table, cells,
                  *(torch.randn(512, 1, 64, generator=gen).to(DEVICE) for _ in range(2)))
    q = torch.randn(4, 2, 64, generator=gen).to(DEVICE)
    positions = torch.arange(253, 257, device=DEVICE)
    window = static_kv.StaticPagedKV(cache, positions, 512)._attend_stored(0, q, (positions + 1).int(), True, None)
    for r in range(4):
        one = static_kv.StaticPagedKV(cache, positions[r:r + 1], static_kv.span_for(254 + r, 512))
        assert torch.equal(window[r:r + 1], one._attend_stored(0, q[r:r + 1], (positions[r:r + 1] + 1).int(), True,
                                                               None))
