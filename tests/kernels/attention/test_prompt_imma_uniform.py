"""imma g1's `u1`: p normalized by the pool's largest V scale instead of each chunk's (no cross-warp max a chunk):
within the parity bounds, also where the pool's largest V scale is 2^14 x every selected one."""

import pytest
import torch

from strata.errors import StrataError
from strata.kernels.attention.prompt import VARIANTS
from strata.kernels.attention.prompt_blocks import PromptConfig
from strata.kernels.attention.prompt_imma_cells import v_bound
from tests.kernels import DEVICE
from tests.kernels.attention.common import queries, random_pool
from tests.kernels.attention.test_prompt_split import assert_within_bounds, case, run  # noqa: F401  (the fixture)


@pytest.mark.parametrize("text", ["t2p16x1g1", "q2h4k2p16x1g1d2"])
def test_uniform_bound_within_parity_bounds(case, text):  # noqa: F811
    # one query a program (the default's form), and blocks of queries with splits and the P.V in halves
    out = run(case, "imma", text + "u1")
    assert_within_bounds(case, out, ("imma", text + "u1"))
    assert not torch.equal(out, run(case, "imma", text))  # another normalization: not g1's bytes


def test_uniform_bound_where_the_pool_bound_is_far_above_the_selected_scales():
    # two pages no query selects hold V scales 2^14 x the others: every selected cell's p is 2^-14 of the bound or
    # less, still kept to ~22 bits (hi alone, 11 bits, would miss the bounds by about 100x)
    from strata.bench.prompt_attn import make_selections, within_bounds
    from strata.kernels.attention.prompt_ref import prompt_attn_ref

    pool, table = random_pool(80, 2, 128, seed=8)
    for page in table[18:20].tolist():  # cells 72 .. 79 (a page is 4 cells x 2 KV heads of pool rows)
        pool.v_scale[page * 8:(page + 1) * 8] = (pool.v_scale[page * 8:(page + 1) * 8].float() * 16384).half()
    ids, width = (t.to(DEVICE) for t in make_selections(70, 6, 64, 8, seed=8))  # cells below 70
    q = queries(6, 4, 128, seed=8)
    ref = prompt_attn_ref(q, pool, table, ids, width).cpu()
    fp32 = VARIANTS["fp32"](q, pool, table, ids, width).cpu()
    out = VARIANTS["imma"](q, pool, table, ids, width, config=PromptConfig.parse("t2p16x1g1u1")).cpu()
    err_fp32 = (fp32.double() - ref).abs().max().item()
    err, vs_fp32 = (out.double() - ref).abs().max().item(), (out - fp32).abs().max().item()
    assert within_bounds(err, vs_fp32, err_fp32, ref.abs().max().item(), fp32.abs().max().item()), err


def test_v_bound_is_the_largest_scale_or_one():
    scales = torch.tensor([[0.5, 0.25], [3.0, 0.125]], dtype=torch.float16, device=DEVICE)
    assert v_bound(scales).cpu().tolist() == [3.0] and v_bound(scales).dtype == torch.float16
    assert v_bound(torch.zeros_like(scales)).cpu().tolist() == [1.0]


def test_uniform_bound_config_and_refusals(case):  # noqa: F811
    config = PromptConfig.parse("t2p16r128x1g1u1")
    assert config.uniform == 1 and PromptConfig.parse(config.label) == config
    assert config.label == "q1h0c32w4s3t2p16r128x1g1u1"
    with pytest.raises(StrataError, match="u 0 or 1"):
        PromptConfig.parse("g1u2").resolve(12)
    for text in ("p16u1", "g1u1"):
        with pytest.raises(StrataError, match="u1 goes with g1 and p16"):
            run(case, "imma", text)
