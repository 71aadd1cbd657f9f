"""The prompt kernels' session-6 tunables: int8 codes to fp16 through their bits (x1: exact, the same bytes) and imma's
scores as one 2D dot per 64-dim group (g1: within the parity bounds)."""

import pytest
import torch
import triton
import triton.language as tl

from strata.errors import StrataError
from strata.kernels.attention.prompt import VARIANTS
from strata.kernels.attention.prompt_blocks import PromptConfig
from strata.kernels.attention.prompt_v1 import codes_to_half
from tests.kernels import DEVICE
from tests.kernels.attention.common import queries, random_pool
from tests.kernels.attention.test_prompt_split import (  # noqa: F401  (the fixture)
    assert_parity, assert_within_bounds, case, run)


@triton.jit
def _codes_kernel(x_ptr, out_ptr, N: tl.constexpr, EXACT: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr + i, codes_to_half(tl.load(x_ptr + i), EXACT))


@pytest.mark.parametrize("exact", [0, 1])
def test_codes_to_half_is_exact_for_every_code(exact):
    codes = torch.arange(-128, 128, dtype=torch.int8, device=DEVICE)
    out = torch.empty(256, dtype=torch.float16, device=DEVICE)
    _codes_kernel[(1,)](codes, out, N=256, EXACT=exact)
    assert torch.equal(out.cpu(), torch.arange(-128, 128, dtype=torch.float16))


def test_config_labels_and_errors():
    config = PromptConfig.parse("t1p16r128x1g1")
    assert (config.translate, config.pv, config.maxreg, config.exact, config.scores) == (1, 16, 128, 1, 1)
    assert config.label == "q1h0c32w4s3t1p16r128x1g1" and PromptConfig.parse(config.label) == config
    for bad in ("x3", "g2", "n3", "d4", "e3"):
        with pytest.raises(StrataError, match="x and e 0 to 2, g 0 or 1, n and d 2"):
            PromptConfig.parse(bad).resolve(12)
    with pytest.raises(StrataError, match="q5h6c32w4s3"):
        PromptConfig.parse("g1x1")  # out of order


@pytest.mark.parametrize("name,base", [("v2", "q1"), ("imma", "p16")])
def test_exact_conversion_gives_the_same_bytes(case, name, base):  # noqa: F811
    # x1: codes through their bits; x2: V also converted before it is staged for the dot
    want = run(case, name, base)
    assert torch.equal(run(case, name, base + "x1"), want) and torch.equal(run(case, name, base + "x2"), want)


@pytest.mark.parametrize("text", ["p16g1", "p16x1g1", "g1", "q2h4k2p16x2g1", "t2p16x1g1"])
def test_scores_per_group_within_parity_bounds(case, text):  # noqa: F811
    # g1 with fp16 P.V (the default's) and with imma's int8 P.V; with blocks of queries, splits, translated ids
    assert_within_bounds(case, run(case, "imma", text), ("imma", text))


@pytest.mark.parametrize("name,text", [("imma", "t2p16x1g1"), ("imma", "q2h4k2p16x2g1"), ("v2", "q2h2k2x1")])
def test_pv_in_halves_gives_the_same_bytes(case, name, text):  # noqa: F811
    # d2: the same p, hi, lo and products, each dim's sum over the chunk's cells in the same dot
    assert torch.equal(run(case, name, text + "d2"), run(case, name, text))


@pytest.mark.parametrize("text", ["t2p16x1g1d2", "q2h4k2p16g1"])
def test_scales_through_one_hot_dots_give_the_same_bytes(case, text):  # noqa: F811
    # e1 (K scales) and e2 (V scales too, fp16 P.V only) through one-hot dots: the same values
    base = run(case, "imma", text)
    assert torch.equal(run(case, "imma", text + "e1"), base)
    if "p16" in text:
        assert torch.equal(run(case, "imma", text + "e2"), base)


@pytest.mark.parametrize("dim,text", [(64, "p16x1g1"), (256, "h1p16x2g1d2"),
                                      # u1 (prompt_imma_uniform.py), whose a1 loads each group's K scales
                                      (64, "p16x1g1u1a1o1"), (256, "h1p16x1g1d2u1a1"), (64, "p16g1u1v1"),
                                      (256, "p16x1g1u1a1o1v1")])
def test_scores_per_group_for_one_and_four_groups(dim, text):
    # head dims of 1 and 4 groups (the kernel unrolls them), 3 query heads a KV head, one a program in some
    from strata.bench.prompt_attn import make_selections
    from strata.kernels.attention.prompt_ref import prompt_attn_ref

    pool, table = random_pool(41, 2, dim, seed=6)
    ids, width = (t.to(DEVICE) for t in make_selections(41, 3, 35, 8, seed=6))
    q = queries(3, 6, dim, seed=6)
    ref = prompt_attn_ref(q, pool, table, ids, width).cpu()
    fp32 = VARIANTS["fp32"](q, pool, table, ids, width).cpu()
    out = VARIANTS["imma"](q, pool, table, ids, width, config=PromptConfig.parse(text)).cpu()
    assert_parity(out, ref, fp32, (dim, text))


def test_scores_per_group_refused_where_it_cannot_run(case):  # noqa: F811
    with pytest.raises(StrataError, match="batched"):
        run(case, "v2", "g1")
    for dim in (192, 320):
        pool, table = random_pool(8, 1, dim, seed=0)
        q = queries(1, 1, dim)
        ids, width = torch.arange(8, device=DEVICE, dtype=torch.int32)[None], torch.tensor([8], device=DEVICE)
        with pytest.raises(StrataError, match=f"head dims of 64, 128, 256, not {dim}"):
            VARIANTS["imma"](q, pool, table, ids, width, config=PromptConfig.parse("g1"))


def test_scores_probe_of_the_per_group_form(case):  # noqa: F811
    from strata.kernels.attention.prompt_probe import probe_imma_scores

    (q, pool, table, ids, width), _, _ = case
    assert not probe_imma_scores(q, pool, table, ids, width, PromptConfig.parse("t1p16g1")).any()


@pytest.mark.parametrize("name,text", [("v2", "q2h2k2t2"), ("imma", "t2p16"), ("imma", "t2p16x1g1")])
def test_rows_of_kv_head_zero_give_the_same_bytes(case, name, text):  # noqa: F811
    # t2: the cells resolved to KV head 0's pool rows, int32 offsets in the kernel; the rows t1 reads
    assert torch.equal(run(case, name, text), run(case, name, text.replace("t2", "t1")))


def test_translated_rows_of_kv_head_zero():
    from strata.kernels.attention.prompt_blocks import translate_cells

    table = torch.tensor([5, 0, 3, 1, 2, 4], dtype=torch.int32, device=DEVICE)
    cells = torch.tensor([[0, 3, 4, 9, 23, -1], [22, 7, 24, 1 << 27, 0, 5]], dtype=torch.int32, device=DEVICE)
    got = translate_cells(cells, table, n_kv_heads=3).cpu()
    table, cells = table.cpu(), cells.cpu()
    for c, r in zip(cells.flatten().tolist(), got.flatten().tolist()):
        assert r == (int(table[c // 4]) * 12 + c % 4 if 0 <= c < 24 else 0)


def test_two_part_q_is_close_but_not_exact(case):  # noqa: F811
    # n2: q rounded to 16 bits per (head, group): an error vs float64 of about 2^-16 of max|q| per score term; stated
    # bound 1e-3 of the output scale (the sweep says whether it meets the parity bounds), and it differs from g1's
    _, ref, _ = case
    out = run(case, "imma", "p16g1n2")
    assert (out.double() - ref).abs().max().item() <= 1e-3 * ref.abs().max().item()
    assert not torch.equal(out, run(case, "imma", "p16g1"))
    for text in ("p16n2", "p16e1", "g1d2", "g1e2"):
        with pytest.raises(StrataError, match="n2 and e1 go with g1, d2 and e2 with p16"):
            run(case, "imma", text)
