"""Prompt attention: every variant against float64 and the fp32 kernel within the parity tool's bounds."""

import pytest
import torch

from strata import switches
from strata.kernels.attention.prompt import VARIANTS, pick_prompt_variant, prompt_attention
from strata.kernels.attention.prompt_ref import prompt_attn_ref
from tests.kernels.attention.common import queries, random_pool, selections

# (KV heads, query heads per KV head, head_dim, cells, query positions, cap)
SHAPES = {
    "small": (2, 3, 128, 150, [0, 1, 30, 31, 32, 40, 63, 149], 40),
    "qsa": (2, 12, 256, 80, [5, 70, 79], 66),
}


def case(shape: str, int8: bool = True, seed: int = 0):
    n_kv_heads, group, dim, n_cells, positions, cap = SHAPES[shape]
    pool, table = random_pool(n_cells, n_kv_heads, dim, int8, seed)
    ids, width = selections(positions, cap, seed)
    return queries(len(positions), n_kv_heads * group, dim, seed), pool, table, ids, width


def errors(out, ref, fp32):
    scale = ref.abs().max().item()
    return (out.double() - ref).abs().max().item(), (out - fp32).abs().max().item(), scale


@pytest.mark.parametrize("shape", list(SHAPES))
def test_variants_within_parity_bounds(shape):
    q, pool, table, ids, width = case(shape)
    ref = prompt_attn_ref(q, pool, table, ids, width).cpu()
    fp32 = VARIANTS["fp32"](q, pool, table, ids, width).cpu()
    err_fp32, _, scale = errors(fp32, ref, fp32)
    assert err_fp32 <= 2e-6 * scale, err_fp32 / scale
    for name in ("v1", "v2", "v2t", "imma"):
        out = VARIANTS[name](q, pool, table, ids, width).cpu()
        err, vs_fp32, _ = errors(out, ref, fp32)
        assert err <= max(4 * err_fp32, 1e-6 * scale), (name, err / scale, err_fp32 / scale)
        assert vs_fp32 <= 1e-4 * scale, (name, vs_fp32 / scale)


def test_fp16_pool():
    q, pool, table, ids, width = case("small", int8=False, seed=1)
    ref = prompt_attn_ref(q, pool, table, ids, width).cpu()
    fp32 = VARIANTS["fp32"](q, pool, table, ids, width).cpu()
    out = VARIANTS["v1"](q, pool, table, ids, width).cpu()
    err_fp32, _, scale = errors(fp32, ref, fp32)
    err, vs_fp32, _ = errors(out, ref, fp32)
    assert err_fp32 <= 2e-6 * scale and err <= max(4 * err_fp32, 1e-6 * scale) and vs_fp32 <= 1e-4 * scale
    with pytest.raises(ValueError):
        VARIANTS["v2"](q, pool, table, ids, width)


def test_reference_matches_dense_softmax():
    q, pool, table, ids, width = case("small")
    ref = prompt_attn_ref(q, pool, table, ids, width)
    from strata.kernels.attention.kv_int8 import gather_kv

    i, h = 5, 4  # query 5 (pos 40, identity selection), head 4 -> KV head 1
    k, v = gather_kv(pool, table, ids[i, : int(width[i])], 1, torch.float64)
    p = torch.softmax(q[i, h].double() @ k.T / 128 ** 0.5, -1)
    torch.testing.assert_close(ref[i, h], p @ v)
    assert torch.equal(ref[len(width) - 1].isfinite(), torch.ones_like(ref[0], dtype=torch.bool))


def test_pick_by_switch_and_capability():
    assert pick_prompt_variant((9, 0)) == "v2"
    assert pick_prompt_variant((7, 5)) == "v2t"
    assert pick_prompt_variant((9, 0), int8=False) == "v1"
    with switches.override(STRATA_PA_V2T=True):
        assert pick_prompt_variant((9, 0)) == "v2t"
    with switches.override(STRATA_PROMPT_ATTN_IMMA=True):
        assert pick_prompt_variant((9, 0)) == "imma" and pick_prompt_variant((7, 5)) == "v2t"
    with switches.override(STRATA_PROMPT_ATTN_OLD=True, STRATA_PROMPT_ATTN_IMMA=True):
        assert pick_prompt_variant((9, 0)) == "fp32" and pick_prompt_variant((9, 0), int8=False) == "fp32"


def test_unset_switches_keep_the_default_bytes():
    q, pool, table, ids, width = case("small", seed=2)
    default = prompt_attention(q, pool, table, ids, width, reference=False)
    defaults = {name: switches.SWITCHES[name].default
                for name in ("STRATA_PROMPT_ATTN_OLD", "STRATA_PA_V2T", "STRATA_PROMPT_ATTN_IMMA", "STRATA_PA_CONFIG")}
    with switches.override(**defaults):
        again = prompt_attention(q, pool, table, ids, width, reference=False)
    assert torch.equal(default.view(torch.int32), again.view(torch.int32))
    assert torch.equal(default.view(torch.int32), VARIANTS["v2"](q, pool, table, ids, width).view(torch.int32))
    with switches.override(STRATA_PROMPT_ATTN_IMMA=True):
        assert not torch.equal(prompt_attention(q, pool, table, ids, width, reference=False), default)
    cpu = prompt_attention(q.cpu(), pool, table.cpu(), ids.cpu(), width.cpu()) if not q.is_cuda else None
    if cpu is not None:  # the CPU default is the reference in fp32
        torch.testing.assert_close(cpu, default, rtol=0, atol=1e-5 * default.abs().max().item())
