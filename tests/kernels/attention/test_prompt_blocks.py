"""Blocked prompt kernels: the merge of a block's selections, the tunables, and every blocking within the parity
bounds on neighbouring queries that share most of their cells."""

from dataclasses import replace

import pytest
import torch

from strata.bench.prompt_attn import make_selections, within_bounds
from strata.errors import StrataError
from strata.kernels.attention.prompt import VARIANTS
from strata.kernels.attention.prompt_blocks import PromptConfig, shared_cells
from strata.kernels.attention.prompt_ref import prompt_attn_ref
from tests.kernels import DEVICE
from tests.kernels.attention.common import queries, random_pool


def merged_by_sets(ids, width, n):
    """The merge written plainly: per block, the sorted union and each cell's bit per selecting query."""
    out = []
    for b0 in range(0, len(width), n):
        chosen = [set(ids[i, : int(width[i])].tolist()) for i in range(b0, min(b0 + n, len(width)))]
        cells = sorted(set().union(*chosen))
        out.append((cells, [sum(1 << j for j, s in enumerate(chosen) if c in s) for c in cells]))
    return out


def random_selections(seed: int, n_q: int = 37, cap: int = 20):
    g = torch.Generator().manual_seed(seed)
    ids = torch.full((n_q, cap), -1, dtype=torch.int32)
    width = torch.randint(0, cap + 1, (n_q,), generator=g).int()
    width[5] = 0
    for i in range(n_q):  # cells from a small range: many shared
        ids[i, : width[i]] = torch.randperm(30, generator=g)[: width[i]].sort().values.int()
    return ids, width


@pytest.mark.parametrize("n", [1, 3, 16])
def test_merge_equals_the_union_of_sets(n, monkeypatch):
    from strata.kernels.attention import prompt_blocks

    monkeypatch.setattr(prompt_blocks, "MERGE_ENTRIES", 100)  # several pieces, the last one short
    ids, width = random_selections(n)
    cap = ids.shape[1]
    cells, members, count = shared_cells(ids, width, n)
    want = merged_by_sets(ids, width, n)
    assert cells.shape == members.shape == (len(want), n * cap + 1) and count.tolist() == [len(c) for c, _ in want]
    for b, (c, bits) in enumerate(want):
        assert cells[b, : len(c)].tolist() == c and members[b, : len(c)].tolist() == bits


@pytest.mark.parametrize("n", [3, 16])
def test_merge_kernel_equals_the_sort(n):
    from strata.kernels.attention.merge_cells import merge_cells_triton

    ids, width = random_selections(n + 1)
    want, got = shared_cells(ids, width, n), merge_cells_triton(ids.to(DEVICE), width.to(DEVICE), n)
    assert torch.equal(got[2].cpu(), want[2])
    for b, c in enumerate(want[2].tolist()):
        assert torch.equal(got[0][b, :c].cpu(), want[0][b, :c]) and torch.equal(got[1][b, :c].cpu(), want[1][b, :c])
        assert not got[0][b, c:].any() and not got[1][b, c:].any()


def test_config_parse_and_resolve():
    assert PromptConfig.parse("q5h6c32w4s3") == PromptConfig(5, 6, 32, 4, 3)
    assert PromptConfig.parse("q2s1") == PromptConfig(queries=2, stages=1)
    config = PromptConfig.parse("q5h8").resolve(12)
    assert config.heads == 6 and config.rows() == 32  # the largest divisor of 12 not above 8; 30 rows padded
    assert PromptConfig(queries=1).resolve(12).rows() == 16 and PromptConfig().resolve(3).heads == 3
    for bad in ("b5", "q5h", ""):
        with pytest.raises(StrataError, match="q5h6c32w4s3"):
            PromptConfig.parse(bad)
    for bad in ("q17", "q0", "c8", "c48", "w3", "s0"):
        with pytest.raises(StrataError, match="prompt-attention config"):
            PromptConfig.parse(bad).resolve(12)


CONFIGS = ["q1h3c32w4s3", "q4h1c32w4s3", "q5h3c32w2s1"]  # few programs: the interpreter is slow


def test_every_blocking_within_parity_bounds():
    # neighbouring queries as the parity tool makes them: identity selections below the cap, then sparse ones
    # sharing a recent window and most older cells; 13 queries, so the last block is partial
    n_cells, cap, n_q = 41, 35, 13  # queries at 28 .. 40
    pool, table = random_pool(n_cells, 2, 128, seed=3)
    ids, width = (t.to(DEVICE) for t in make_selections(n_cells, n_q, cap, 8, seed=3))
    width[6] = 0  # a query with nothing selected, in a block with others: zeros
    q = queries(n_q, 6, 128, seed=3)
    ref = prompt_attn_ref(q, pool, table, ids, width).cpu()
    fp32 = VARIANTS["fp32"](q, pool, table, ids, width).cpu()
    scale, fp32_scale = ref.abs().max().item(), fp32.abs().max().item()
    err_fp32 = (fp32.double() - ref).abs().max().item()
    assert (width < cap).any() and (width == cap).any() and not ref[6].any()
    for name in ("v2", "imma"):
        for text in CONFIGS:
            out = VARIANTS[name](q, pool, table, ids, width, config=PromptConfig.parse(text)).cpu()
            err, vs_fp32 = (out.double() - ref).abs().max().item(), (out - fp32).abs().max().item()
            assert within_bounds(err, vs_fp32, err_fp32, scale, fp32_scale), (name, text, err / scale)


def test_config_switch_sets_the_default_blocking():
    from strata import switches
    from strata.kernels.attention.prompt_v2 import DEFAULT

    assert PromptConfig.chosen(None, DEFAULT) == DEFAULT  # unset
    with switches.override(STRATA_PA_CONFIG="q2w8"):
        assert PromptConfig.chosen(None, DEFAULT) == replace(DEFAULT, queries=2, warps=8)  # the rest as the default's
        assert PromptConfig.chosen(PromptConfig(3), DEFAULT) == PromptConfig(3)  # the caller's wins
    with switches.override(STRATA_PA_CONFIG="fast"), pytest.raises(StrataError, match="q5h6c32w4s3"):
        PromptConfig.chosen(None, DEFAULT)


def test_launches_in_slices_of_blocks_give_the_same_bytes(monkeypatch):
    from strata.kernels.attention import prompt_blocks

    pool, table = random_pool(41, 2, 64, seed=4)
    ids, width = (t.to(DEVICE) for t in make_selections(41, 7, 35, 8, seed=4))
    q = queries(7, 4, 64, seed=4)
    config = PromptConfig.parse("q2h2c32w4s1")
    whole = VARIANTS["v2"](q, pool, table, ids, width, config=config)
    monkeypatch.setattr(prompt_blocks, "MAX_GRID_Y", 3)  # 4 blocks: launches of 3 and 1
    assert torch.equal(VARIANTS["v2"](q, pool, table, ids, width, config=config), whole)
