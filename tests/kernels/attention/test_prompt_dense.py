"""The selected-cells kernel over a dense fp16 cache: against float64 within the prompt kernels' bound, against the
dense-mask SDPA it replaces, and KVCache.attend's choice between them (the switch, the cache's dtype)."""

import pytest
import torch

from strata import switches
from strata.engine.kv import KVCache, attend_selected
from strata.kernels.attention.prompt_blocks import PromptConfig
from strata.kernels.attention.prompt_dense import (ERROR_FLOOR, dense_kernel_applies, dense_selected_attention,
                                                   dense_selected_ref)
from tests.kernels import DEVICE
from tests.kernels.attention.common import queries, selections

# (KV heads, query heads per KV head, head_dim, cells, query positions, cap)
SHAPES = {
    "small": (2, 3, 64, 150, [0, 1, 30, 31, 32, 40, 63, 149], 40),
    "qsa": (2, 12, 256, 80, [5, 70, 79], 66),  # the full-size qwen4exp's heads
    "tiny": (2, 2, 32, 50, [3, 20, 35, 49], 11),  # the tiny qwen4exp's heads, top_k 8
}
CONFIGS = [None, "q2h0c16w4s1", "q4h1c32w4s2", "q1c16w4s1k3", "q2h1c16w4s1k2"]  # the default, merged blocks, split-K


def cache(n_cells: int, n_kv_heads: int, dim: int, seed: int, spare: int = 7):
    """fp16 keys ~ N(0, 1.5^2), values ~ N(0, 1), [n_cells + spare, Hkv, D] (cells past the selections unused)."""
    g = torch.Generator().manual_seed(seed)
    keys = (torch.randn(n_cells + spare, n_kv_heads, dim, generator=g) * 1.5).half()
    values = torch.randn(n_cells + spare, n_kv_heads, dim, generator=g).half()
    return keys.to(DEVICE), values.to(DEVICE)


def case(shape: str, seed: int = 0):
    n_kv_heads, group, dim, n_cells, positions, cap = SHAPES[shape]
    keys, values = cache(n_cells, n_kv_heads, dim, seed)
    ids, width = selections(positions, cap, seed)
    return queries(len(positions), n_kv_heads * group, dim, seed), keys, values, ids, width


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("config", CONFIGS)
def test_within_the_prompt_kernels_bound(shape, config):
    """Error vs float64 at most max(4 x the fp32 reference's, ERROR_FLOOR of the output scale); within 1e-4 of the
    output scale of the dense-mask SDPA (fp32) it replaces."""
    if shape == "qsa" and config is not None:
        pytest.skip("one config at the large shape (interpreter time)")
    q, keys, values, ids, width = case(shape)
    config = None if config is None else PromptConfig.parse(config)
    out = dense_selected_attention(q, keys, values, ids, width, config=config).cpu()
    ref = dense_selected_ref(q, keys, values, ids, width).cpu()
    fp32 = dense_selected_ref(q, keys, values, ids, width, dtype=torch.float32).cpu()
    scale = ref.abs().max().item()
    err, err_fp32 = (out.double() - ref).abs().max().item(), (fp32.double() - ref).abs().max().item()
    assert err_fp32 <= 2e-6 * scale, err_fp32 / scale
    assert err <= max(4 * err_fp32, ERROR_FLOOR * scale), (err / scale, err_fp32 / scale)
    sdpa = attend_selected(q, keys.float(), values.float(), ids, width).cpu()
    assert (out - sdpa).abs().max() <= 1e-4 * scale


def test_reference_is_softmax_over_the_selected_cells():
    q, keys, values, ids, width = case("small")
    ref = dense_selected_ref(q, keys, values, ids, width).cpu()
    i, h = 7, 4  # query 7 (pos 149, a sparse selection), head 4 -> KV head 1
    cells = ids[i, : int(width[i])].long().cpu()
    k, v = keys[cells, 1].double().cpu(), values[cells, 1].double().cpu()
    p = torch.softmax(q[i, h].double().cpu() @ k.T / 64 ** 0.5, -1)
    torch.testing.assert_close(ref[i, h], p @ v)


@pytest.mark.parametrize("config", [None, "q1c16w4s1k3"])
def test_empty_selection_gives_zero_and_others_unchanged(config):
    q, keys, values, ids, width = case("small")
    width = width.clone()
    width[2] = 0
    config = None if config is None else PromptConfig.parse(config)
    out = dense_selected_attention(q, keys, values, ids, width, config=config).cpu()
    assert torch.equal(out[2], torch.zeros_like(out[2])) and out[3].abs().max() > 0


def test_applies_to_fp16_caches_of_power_of_two_heads_only():
    assert dense_kernel_applies(torch.zeros(4, 2, 64, dtype=torch.float16), 6)
    assert not dense_kernel_applies(torch.zeros(4, 2, 64, dtype=torch.bfloat16), 6)
    assert not dense_kernel_applies(torch.zeros(4, 2, 96, dtype=torch.float16), 6)
    assert not dense_kernel_applies(torch.zeros(4, 2, 64, dtype=torch.float16), 5)
    with pytest.raises(ValueError, match="fp16 caches"):
        dense_selected_attention(torch.zeros(1, 6, 64), *(torch.zeros(4, 2, 64) for _ in range(2)),
                                 torch.zeros(1, 4, dtype=torch.int32), torch.ones(1, dtype=torch.int32))


def _kv_cache_case(dtype, kernels):
    """A one-layer cache holding 40 cells, then a 6-token chunk at 40 with a selection (the chunk's keys in it)."""
    n_kv_heads, dim, start, n = 2, 32, 40, 6
    kv = KVCache(1, n_kv_heads, dim, 64, dtype, torch.device(DEVICE))
    kv.kernels = kernels
    g = torch.Generator().manual_seed(3)
    past_k, past_v = (torch.randn(start, n_kv_heads, dim, generator=g).to(DEVICE) for _ in range(2))
    kv.attend(0, torch.zeros(start, 4, dim, device=DEVICE), past_k, past_v, 0)
    q = torch.randn(n, 4, dim, generator=g).to(DEVICE)
    k, v = (torch.randn(n, n_kv_heads, dim, generator=g).to(DEVICE) for _ in range(2))
    ids, width = selections(list(range(start, start + n)), 11, seed=4)
    return kv, q, k, v, start, (ids, width)


def test_kv_cache_takes_the_kernel_for_a_selection_and_the_switch_restores_sdpa():
    kv, q, k, v, start, sel = _kv_cache_case(torch.float16, kernels=True)
    new = kv.attend(0, q, k, v, start, sel)
    with switches.override(STRATA_QSA_DENSE_MASK=True):
        old = kv.attend(0, q, k, v, start, sel)
    plain, *rest = _kv_cache_case(torch.float16, kernels=False)
    assert torch.equal(plain.attend(0, *rest), old)  # the switch: the old path's bytes
    ids, width = sel
    # the kernel reads the chunk's keys as stored (fp16), the old path at full precision
    ref = dense_selected_ref(q, kv.keys[0], kv.values[0], ids, width)
    scale = ref.abs().max().item()
    assert (new.double() - ref).abs().max() <= 1e-6 * scale
    assert not torch.equal(new, old) and (new - old).abs().max() <= 2e-3 * scale  # k, v's fp16 rounding apart


def test_kv_cache_keeps_sdpa_where_the_kernel_does_not_apply():
    for dtype, kernels in ((torch.float16, None), (torch.bfloat16, True), (torch.float32, True)):
        kv, q, k, v, start, sel = _kv_cache_case(dtype, kernels)
        if DEVICE == "cuda" and kernels is None and dtype == torch.float16:
            continue  # on a GPU the fp16 cache takes the kernel by default
        kv_old, *rest = _kv_cache_case(dtype, False)
        with switches.override(STRATA_QSA_DENSE_MASK=True):
            want = kv_old.attend(0, *rest)
        assert torch.equal(kv.attend(0, q, k, v, start, sel), want), (dtype, kernels)


def test_static_view_window_rows_are_their_decode_steps_bytes():
    """The static decode view over an fp16 cache with a selection: a 3-row window's rows equal, byte for byte, the
    one-token steps of KVCache.attend (and of the view) at their positions; the kernel, not SDPA."""
    from strata.engine.static_kv import StaticDenseKV

    kv, q, k, v, start, (ids, width) = _kv_cache_case(torch.float16, kernels=True)
    q, k, v, ids, width = q[:3], k[:3], v[:3], ids[:3], width[:3]
    kv.reserve(64)
    positions = torch.arange(start, start + 3, device=DEVICE)
    window = StaticDenseKV(kv, positions, 64).attend(0, q, k, v, start, (ids, width))
    for r in range(3):
        step = kv.attend(0, q[r:r + 1], k[r:r + 1], v[r:r + 1], start + r, (ids[r:r + 1], width[r:r + 1]))
        view = StaticDenseKV(kv, positions[r:r + 1], 64).attend(0, q[r:r + 1], k[r:r + 1], v[r:r + 1], start + r,
                                                                (ids[r:r + 1], width[r:r + 1]))
        assert torch.equal(window[r], step[0]) and torch.equal(view, step)
    ref = dense_selected_ref(q, kv.keys[0], kv.values[0], ids, width)
    assert (window.double() - ref).abs().max() <= 1e-6 * ref.abs().max()
