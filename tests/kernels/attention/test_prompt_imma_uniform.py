"""imma g1's `u1`: p normalized by the pool's largest V scale instead of each chunk's (no cross-warp max a chunk):
within the parity bounds, also where the pool's largest V scale is 2^14 x every selected one; `a1`: its K and V scales
loaded a chunk ahead, `o1`: V codes read as 16-bit words split into even and odd dims, and `v1`: p made in the scores'
layout, the same bytes."""

import pytest
import torch
import triton
import triton.language as tl

from strata.errors import StrataError
from strata.kernels.attention.prompt import VARIANTS
from strata.kernels.attention.prompt_blocks import PromptConfig
from strata.kernels.attention.prompt_imma_uniform import v_pairs, v_bound
from tests.kernels import DEVICE
from tests.kernels.attention.common import queries, random_pool
from tests.kernels.attention.test_prompt_split import (  # noqa: F401  (the fixture)
    assert_parity, assert_within_bounds, case, run)


@pytest.mark.parametrize("text", ["t2p16x1g1", "q2h4k2p16x1g1d2"])
def test_uniform_bound_within_parity_bounds(case, text):  # noqa: F811
    # one query a program (the default's form), and blocks of queries with splits and the P.V in halves
    out = run(case, "imma", text + "u1")
    assert_within_bounds(case, out, ("imma", text + "u1"))
    assert not torch.equal(out, run(case, "imma", text))  # another normalization: not g1's bytes


def test_uniform_bound_where_the_pool_bound_is_far_above_the_selected_scales():
    # two pages no query selects hold V scales 2^14 x the others: every selected cell's p is 2^-14 of the bound or
    # less, still kept to ~22 bits (hi alone, 11 bits, would miss the bounds by about 100x)
    from strata.bench.prompt_attn import make_selections
    from strata.kernels.attention.prompt_ref import prompt_attn_ref

    pool, table = random_pool(80, 2, 128, seed=8)
    for page in table[18:20].tolist():  # cells 72 .. 79 (a page is 4 cells x 2 KV heads of pool rows)
        pool.v_scale[page * 8:(page + 1) * 8] = (pool.v_scale[page * 8:(page + 1) * 8].float() * 16384).half()
    ids, width = (t.to(DEVICE) for t in make_selections(70, 6, 64, 8, seed=8))  # cells below 70
    q = queries(6, 4, 128, seed=8)
    ref = prompt_attn_ref(q, pool, table, ids, width).cpu()
    fp32 = VARIANTS["fp32"](q, pool, table, ids, width).cpu()
    out = VARIANTS["imma"](q, pool, table, ids, width, config=PromptConfig.parse("t2p16x1g1u1")).cpu()
    assert_parity(out, ref, fp32, "2^14")


@pytest.mark.parametrize("text", ["t2p16x1g1d2u1", "q2h4k2p16x1g1u1", "t1p16g1u1"])
def test_scales_a_chunk_ahead_give_the_same_bytes(case, text):  # noqa: F811
    # the same scale values in the same products; with splits the last chunk's look-ahead reads past its share
    assert torch.equal(run(case, "imma", text + "a1"), run(case, "imma", text))


def same_sums(got: torch.Tensor, want: torch.Tensor) -> bool:
    """The same products summed: byte for byte under the interpreter; compiled (the H200, Triton 3.6) the dots of
    another operand layout sum in another order, so within 1e-5 of the output scale (the parity tool's bound against
    the fp32 kernel is 1e-4)."""
    if torch.device(DEVICE).type != "cuda":
        return torch.equal(got, want)
    return (got.float() - want.float()).abs().max().item() <= 1e-5 * want.float().abs().max().item()


@pytest.mark.parametrize("text", ["t2p16x1g1u1", "q2h4k2p16g1u1a1"])
def test_v_as_word_pairs_gives_the_same_sums(case, text):  # noqa: F811
    # o1: each dim's products and sums over the chunk's cells in the same dot as before, the codes exact as fp16
    assert same_sums(run(case, "imma", text + "o1"), run(case, "imma", text))


@pytest.mark.parametrize("text", ["t2p16x1g1u1", "q2h4k2p16g1d2u1", "t1p16g1u1a1o1"])
def test_p_made_in_the_scores_layout_gives_the_same_sums(case, text):  # noqa: F811
    # v1: the same products e * (v_scale * up), moved as one tensor (a1: its columns loaded a chunk ahead); two groups
    # here (head dim 128)
    assert same_sums(run(case, "imma", text + "v1"), run(case, "imma", text))


@triton.jit
def _pairs_kernel(v_ptr, even_ptr, odd_ptr, CH: tl.constexpr):
    rows = tl.program_id(0) * CH + tl.arange(0, CH)
    even, odd = v_pairs(v_ptr, rows, rows >= 0, 1)
    i = rows[None, :, None] * 32 + tl.arange(0, 32)[None, None, :]
    tl.store(even_ptr + i, even)
    tl.store(odd_ptr + i, odd)


def test_v_word_pairs_are_exact_for_every_pair_of_codes():
    # every (low, high) byte pair once: 65,536 words, rows of 64 codes (one group)
    codes = torch.arange(-128, 128, dtype=torch.int8)
    pairs = torch.stack(torch.meshgrid(codes, codes, indexing="ij"), -1).reshape(2048, 64)  # (even, odd) per word
    even = torch.empty(2048, 32, dtype=torch.float16, device=DEVICE)
    odd = torch.empty_like(even)
    _pairs_kernel[(2048 // 64,)](pairs.to(DEVICE), even, odd, CH=64)
    assert torch.equal(even.cpu(), pairs[:, 0::2].half()) and torch.equal(odd.cpu(), pairs[:, 1::2].half())


def test_v_bound_is_the_largest_scale():
    scales = torch.tensor([[0.5, 0.25], [3.0, 0.125]], dtype=torch.float16, device=DEVICE)
    assert v_bound(scales).cpu().tolist() == [3.0] and v_bound(scales).dtype == torch.float16
    assert v_bound(torch.zeros_like(scales)).cpu().tolist() == [0.0]  # the kernel reads it as 1


def test_all_zero_v_scales_give_zeros():
    # the pool's bound is 0 (every V scale 0): the kernel's bound is 1, p stays finite, the output exactly 0
    from strata.bench.prompt_attn import make_selections

    pool, table = random_pool(40, 2, 128, seed=4)
    pool.v_scale.zero_()
    ids, width = (t.to(DEVICE) for t in make_selections(40, 4, 35, 8, seed=4))
    out = VARIANTS["imma"](queries(4, 4, 128, seed=4), pool, table, ids, width,
                           config=PromptConfig.parse("t2p16x1g1u1a1o1")).cpu()
    assert torch.equal(out, torch.zeros_like(out))


def test_uniform_bound_config_and_refusals(case):  # noqa: F811
    config = PromptConfig.parse("t2p16r128x1g1u1")
    assert config.uniform == 1 and PromptConfig.parse(config.label) == config
    assert config.label == "q1h0c32w4s3t2p16r128x1g1u1"
    assert PromptConfig.parse("t2p16x1g1u1a1").label == "q1h0c32w4s3t2p16x1g1u1a1"
    for bad in ("g1u2", "g1u1a2", "g1u1o2", "g1u1v2"):
        with pytest.raises(StrataError, match="u, a, o and v 0 or 1"):
            PromptConfig.parse(bad).resolve(12)
    for text in ("p16u1", "g1u1", "p16g1a1", "p16g1o1", "p16g1v1"):
        with pytest.raises(StrataError, match="u1 goes with g1 and p16, a1, o1 and v1 with u1"):
            run(case, "imma", text)


