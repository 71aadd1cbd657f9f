"""Prefix blocks (`i1`, `i2`: consecutive queries whose selections are prefixes of the block's last one share its
chunks, each row masked by its query's width), the launch order (`z1`) and the splits' spread rule (`y`)."""

import pytest
import torch

from strata.bench.prompt_attn import make_selections
from strata.errors import StrataError
from strata.kernels.attention.prompt import VARIANTS
from strata.kernels.attention.prompt_blocks import PromptConfig, spread_splits, translate_cells
from strata.kernels.attention.prompt_prefix import prefix_flags, prefix_flags_ref
from strata.kernels.attention.prompt_ref import prompt_attn_ref
from tests.kernels import DEVICE
from tests.kernels.attention.common import queries, random_pool
from tests.kernels.attention.test_prompt_imma_uniform import same_sums
from tests.kernels.attention.test_prompt_split import assert_parity

BASE = "t2p16x1g1u1a1o1"  # the default's form (one query and its group a program), at the tests' small size


@pytest.fixture(scope="module")
def identity_case():
    """The parity tool's selections for queries at 58 .. 69 with 67 cells a selection: the first nine select every
    cell up to themselves (the identity), the last three are sparse; 8 query heads on 2 KV heads (groups of 4)."""
    n_cells, cap, n_q = 70, 67, 12
    pool, table = random_pool(n_cells, 2, 128, seed=9)
    ids, width = (t.to(DEVICE) for t in make_selections(n_cells, n_q, cap, 16, seed=9))
    q = queries(n_q, 8, 128, seed=9)
    ref = prompt_attn_ref(q, pool, table, ids, width).cpu()
    fp32 = VARIANTS["fp32"](q, pool, table, ids, width).cpu()
    return (q, pool, table, ids, width), ref, fp32


def run(case, text: str) -> torch.Tensor:
    return VARIANTS["imma"](*case[0], config=PromptConfig.parse(text)).cpu()


def test_flags_equal_the_reference():
    # identity rows, sparse rows, an empty row, a row wider than its block's last, a short last block
    ids, width = make_selections(70, 13, 67, 16, seed=3)
    width[5] = 0
    ids[9, :3], width[9] = torch.tensor([0, 1, 2], dtype=torch.int32), 3  # a prefix of anything identity
    table = torch.randperm(18).int().to(DEVICE)
    for queries_ in (2, 3, 4, 5):
        want = prefix_flags_ref(ids, width, queries_)
        got = prefix_flags(ids.to(DEVICE), width.to(DEVICE), queries_).cpu()
        assert torch.equal(got, want), queries_
        # with the translation, in its launch (t1, t2): its cells as alone, the same flags
        for rows in (1, 2):
            cells, flags = translate_cells(ids.to(DEVICE), table, rows, width.to(DEVICE), queries_)
            assert torch.equal(flags.cpu(), want) and torch.equal(cells, translate_cells(ids.to(DEVICE), table, rows))
    # 57..60 identity; 61..64 with an empty row (a prefix of any list); 65..68 identity, sparse; 69 alone
    assert prefix_flags_ref(ids, width, 4).tolist() == [1, 1, 0, 1]
    wider = width.clone()
    wider[0] = 67  # wider than its block's last query (58: 59 cells)
    assert prefix_flags(ids.to(DEVICE), wider.to(DEVICE), 2).cpu()[0] == 0 == prefix_flags_ref(ids, wider, 2)[0]


def test_flags_look_past_the_first_tile():
    # 600 cells a row (three tiles of 256): a difference at entry 400, one at the very last entry, none
    ids = torch.arange(600, dtype=torch.int32).repeat(6, 1)
    ids[0, 400], ids[2, 599] = 1400, 5000
    width = torch.full((6,), 600, dtype=torch.int32)
    assert prefix_flags_ref(ids, width, 2).tolist() == [0, 0, 1]
    assert prefix_flags(ids.to(DEVICE), width.to(DEVICE), 2).cpu().tolist() == [0, 0, 1]


@pytest.mark.parametrize("text", ["q4h4" + BASE + "i1", "q2h2" + BASE + "i2z1", "q3h4k2" + BASE + "i1"])
def test_prefix_blocks_within_parity_bounds(identity_case, text):
    # four queries x four heads (16 rows, all real), two queries a program on a second stream, blocks of three
    # (one straddling the identity and the sparse queries) with splits
    assert_parity(run(identity_case, text), identity_case[1], identity_case[2], text)


@pytest.mark.parametrize("queries_", [2, 4])
def test_prefix_blocks_give_the_one_query_sums_and_bytes(identity_case, queries_):
    # a prefix query's rows see the same chunks at the same boundaries (the same sums); a query of a block that does
    # not qualify runs the one-query launch itself (the same bytes)
    case = identity_case
    base = run(case, BASE)
    out = run(case, f"q{queries_}h{queries_}{BASE}i1")
    flags = prefix_flags_ref(case[0][3].cpu(), case[0][4].cpu(), queries_)
    prefixed = flags.repeat_interleave(queries_)[:12].bool()
    assert prefixed.any() and not prefixed.all()
    assert same_sums(out[prefixed], base[prefixed])
    assert torch.equal(out[~prefixed], base[~prefixed])


def test_second_stream_gives_the_same_bytes(identity_case):
    assert torch.equal(run(identity_case, "q4h4" + BASE + "i2"), run(identity_case, "q4h4" + BASE + "i1"))


@pytest.mark.parametrize("name,text", [("imma", BASE), ("imma", "q2h2" + BASE + "i1"), ("v2", "q2h2t1")])
def test_reversed_order_gives_the_same_bytes(identity_case, name, text):
    config = PromptConfig.parse(text)
    reverse = PromptConfig.parse(text + "z1")
    args = identity_case[0]
    assert torch.equal(VARIANTS[name](*args, config=reverse), VARIANTS[name](*args, config=config))


def test_spread_rule_splits_only_launches_with_few_programs():
    config = PromptConfig.parse("y4")
    cpu = torch.device("cpu")  # off the GPU the rule counts the H200's 132 SMs
    assert spread_splits(config, 2 * 1024, 2051, cpu) == 1  # 32K x 1024: 2,048 programs, the bytes as before
    assert spread_splits(config, 2 * 256, 2051, cpu) == 2  # 2.1K x 256: 528 wanted
    assert spread_splits(PromptConfig.parse("y8"), 2 * 256, 2051, cpu) == 3
    assert spread_splits(PromptConfig.parse("y8"), 2, 2051, cpu) == 8  # 2,051 cells: 8 splits of 8 chunks at most
    assert spread_splits(PromptConfig.parse("k4y4"), 4096, 2051, cpu) == 4  # never fewer than k
    assert spread_splits(PromptConfig.parse("k4"), 2, 2051, cpu) == 4  # no y: k alone


def test_config_labels_and_refusals(identity_case):
    config = PromptConfig.parse("q4h4" + BASE + "i2z1y4")
    assert (config.prefix, config.order, config.spread) == (2, 1, 4)
    assert config.label == "q4h4c32w4s3t2p16x1g1u1a1o1i2z1y4" and PromptConfig.parse(config.label) == config
    for bad in ("i3", "z2", "y33"):
        with pytest.raises(StrataError, match="i 0 to 2, z 0 or 1, y 0 to 32"):
            PromptConfig.parse(bad).resolve(12)
    with pytest.raises(StrataError, match="go with g1"):
        run(identity_case, "q2p16i1")
    with pytest.raises(StrataError, match="imma g1's"):
        VARIANTS["v2"](*identity_case[0], config=PromptConfig.parse("q2i1"))
