"""The prompt kernels' later tunables: split-K over the cells (k), ids resolved through the page table before the
launch (t), imma's fp16 P.V (p), a register cap (r); and the sweep's probes."""

import pytest
import torch

from strata.bench.prompt_attn import make_selections, within_bounds
from strata.errors import StrataError
from strata.kernels.attention.prompt import VARIANTS
from strata.kernels.attention.prompt_blocks import PromptConfig, translate_cells
from strata.kernels.attention.prompt_ref import prompt_attn_ref
from tests.kernels import DEVICE
from tests.kernels.attention.common import queries, random_pool


@pytest.fixture(scope="module")
def case():
    """Neighbouring queries as the parity tool makes them (identity selections below the cap, then sparse ones), one
    with nothing selected; their float64 reference and the fp32 kernel's output."""
    n_cells, cap, n_q = 75, 67, 12  # queries at 63 .. 74: widths 64 .. 67, 3 chunks of 32 (the last short)
    pool, table = random_pool(n_cells, 2, 128, seed=5)
    ids, width = (t.to(DEVICE) for t in make_selections(n_cells, n_q, cap, 16, seed=5))
    width[3] = 0
    q = queries(n_q, 4, 128, seed=5)
    ref = prompt_attn_ref(q, pool, table, ids, width).cpu()
    fp32 = VARIANTS["fp32"](q, pool, table, ids, width).cpu()
    return (q, pool, table, ids, width), ref, fp32


def run(case, name: str, text: str) -> torch.Tensor:
    return VARIANTS[name](*case[0], config=PromptConfig.parse(text)).cpu()


def assert_parity(out, ref, fp32, what):
    """The parity tool's bounds: `out` against the float64 reference, no worse than the fp32 kernel's error."""
    scale, fp32_scale = ref.abs().max().item(), fp32.abs().max().item()
    err_fp32 = (fp32.double() - ref).abs().max().item()
    err, vs_fp32 = (out.double() - ref).abs().max().item(), (out - fp32).abs().max().item()
    assert within_bounds(err, vs_fp32, err_fp32, scale, fp32_scale), (what, err / scale, vs_fp32 / fp32_scale)


def assert_within_bounds(case, out, what):
    _, ref, fp32 = case
    assert_parity(out, ref, fp32, what)
    assert not out[3].any()  # the query with no cells: zeros


def test_config_labels_and_errors():
    config = PromptConfig.parse("q1h0c32w4s3k4t1f1p16r128")
    assert (config.splits, config.translate, config.prefetch, config.pv, config.maxreg) == (4, 1, 1, 16, 128)
    assert config.label == "q1h0c32w4s3k4t1f1p16r128" and PromptConfig.parse(config.label) == config
    assert PromptConfig().label == "q1h0c32w4s3" and PromptConfig.parse("k1").label == "q1h0c32w4s3"
    assert PromptConfig.parse("t1", PromptConfig(queries=2)).label == "q2h0c32w4s3t1"
    for bad in ("k0", "k65", "t3", "f2", "p8", "r16", "r300"):
        with pytest.raises(StrataError, match="prompt-attention config"):
            PromptConfig.parse(bad).resolve(12)
    with pytest.raises(StrataError, match="q5h6c32w4s3"):
        PromptConfig.parse("k2q1")  # out of order


def test_translated_cells_equal_the_page_table_rows():
    # on the test's device: a GPU runs the translating kernel compiled, which reads device memory only
    table = torch.tensor([5, 0, 3, 1, 2, 4], dtype=torch.int32, device=DEVICE)
    cells = torch.tensor([[0, 3, 4, 9, 23, -1], [22, 7, 24, 1 << 27, 0, 5]], dtype=torch.int32, device=DEVICE)
    got = translate_cells(cells, table).cpu()
    table, cells = table.cpu(), cells.cpu()
    for c, p in zip(cells.flatten().tolist(), got.flatten().tolist()):
        assert p == (int(table[c // 4]) * 4 + c % 4 if 0 <= c < 24 else 0)


@pytest.mark.parametrize("name", ["v2", "imma"])
def test_translated_or_prefetched_launch_gives_the_same_bytes(case, name):
    # one query (its ids), and for v2 blocks too (merged cells, with the padding column); prefetched rows with the
    # page table and without, and with splits (the prefetch past a split's end is masked or never used)
    base = run(case, name, "q1")
    assert torch.equal(run(case, name, "t1"), base) and torch.equal(run(case, name, "f1"), base)
    if name == "v2":
        assert torch.equal(run(case, name, "q2h2t1f1"), run(case, name, "q2h2"))
        assert torch.equal(run(case, name, "k2f1"), run(case, name, "k2"))


@pytest.mark.parametrize("name", ["v2", "imma"])
def test_splits_within_parity_bounds(case, name):
    # k2: 2 + 1 chunks; k4: one chunk each, the fourth empty (m = -inf, l = 0, weight 0); with blocks of queries
    for text in ("k4", "q2h2k2t1") if name == "v2" else ("k2",):
        assert_within_bounds(case, run(case, name, text), (name, text))


def test_imma_fp16_pv_within_parity_bounds(case):
    assert_within_bounds(case, run(case, "imma", "p16"), "imma p16")
    assert_within_bounds(case, run(case, "imma", "q2h4k2p16"), "imma q2h4k2p16")


def test_register_cap_changes_no_math(case):
    assert torch.equal(run(case, "v2", "r128"), run(case, "v2", "q1"))
    with pytest.raises(StrataError, match="p16"):
        VARIANTS["v2"](*case[0], config=PromptConfig(pv=8))


def test_probes(case):
    from strata.kernels.attention.prompt_probe import probe_gather, probe_imma_scores

    (q, pool, table, ids, width), _, _ = case
    got = probe_gather(q, pool, table, ids, width, PromptConfig()).cpu()
    for i in (0, 3, 11):
        cells = ids[i, : int(width[i])].long().cpu()
        for kvh in range(2):
            rows = (table.cpu()[cells // 4].long() * 2 + kvh) * 4 + cells % 4
            want = pool.v.cpu()[rows].long().sum(0).float()
            assert torch.equal(got[i, 2 * kvh], want) and torch.equal(got[i, 2 * kvh + 1], want)
    assert not probe_imma_scores(q, pool, table, ids, width, PromptConfig.parse("t1")).any()
