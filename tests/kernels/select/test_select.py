"""QSA selection: keys, block scores (kernel vs reference), top-k cells (reference = spec, kernel = reference)."""

import math

import pytest
import torch

from strata.kernels.select.keys import dead_key, pool_block_keys, rope_neox
from strata.kernels.select.scores import block_scores_ref, block_scores_triton
from strata.kernels.select.topk import select_cells_ref, select_cells_triton
from tests.kernels import DEVICE


def spec_select(scores: torch.Tensor, n_kv: int, top_k: int) -> list[int]:
    """The spec for one query: cell scores from blocks, stable sort of -score, the first width, ascending."""
    cell_scores = scores.repeat_interleave(4)[:n_kv]
    order = torch.sort(-cell_scores, stable=True).indices
    return sorted(order[: min(n_kv, top_k + 3)].tolist())


def tie_scores(n_q: int, n_cols: int, seed: int) -> torch.Tensor:
    """Scores with many ties (a handful of levels) and the special floats: +-0, -inf, +inf, NaN, the tail bonus."""
    g = torch.Generator().manual_seed(seed)
    levels = torch.tensor([0.0, -0.0, 1.0, 2.5, -3.0, 7.0, 1e9, float("-inf"), float("inf"), float("nan"), 2.5, 1.0])
    s = levels[torch.randint(0, len(levels), (n_q, n_cols), generator=g)]
    noisy = torch.rand(n_q, n_cols, generator=g) < 0.3
    return torch.where(noisy, torch.randint(-4, 5, (n_q, n_cols), generator=g).float() * 0.5, s)


CASES = [  # (n_kv per query, top_k)
    ([1, 2, 3, 4, 5, 18, 19, 20, 21, 22, 23, 24, 37, 64, 65, 66, 67, 99, 200, 201], 16),
    ([3000, 3001, 3002, 3003, 2051, 2052, 4096, 5000], 2048),
]


@pytest.mark.parametrize("n_kv, top_k", CASES)
def test_reference_is_the_spec(n_kv, top_k):
    n_kv = torch.tensor(n_kv)
    scores = tie_scores(len(n_kv), math.ceil(int(n_kv.max()) / 4) + 1, seed=top_k)
    ids, width = select_cells_ref(scores, n_kv, top_k)
    for i, n in enumerate(n_kv.tolist()):
        w = int(width[i])
        assert w == min(n, top_k + 3)
        assert ids[i, :w].tolist() == spec_select(scores[i], n, top_k)
        assert (ids[i, w:] == -1).all()


@pytest.mark.parametrize("n_kv, top_k, tile", [(*CASES[0], 16), (*CASES[0], 1024), (*CASES[1], 256)])
def test_kernel_equals_reference(n_kv, top_k, tile):
    n_kv = torch.tensor(n_kv)
    for seed in range(2):
        scores = tie_scores(len(n_kv), math.ceil(int(n_kv.max()) / 4) + 3, seed=seed + 10 * top_k)
        want = select_cells_ref(scores, n_kv, top_k)
        got = select_cells_triton(scores.to(DEVICE), n_kv.to(DEVICE), top_k, tile=tile)
        assert torch.equal(got[1].cpu(), want[1])
        assert torch.equal(got[0].cpu(), want[0])


def test_tail_is_always_selected():
    g = torch.Generator().manual_seed(5)
    n_q, dk, n_blocks = 6, 128, 40
    q = torch.randn(n_q, 4, dk, generator=g)
    keys, dead = torch.randn(n_blocks, dk, generator=g), torch.randn(dk, generator=g)
    n_kv = torch.tensor([157, 158, 159, 160, 161, 100])
    ids, width = select_cells_ref(block_scores_ref(q, keys, dead, n_kv), n_kv, top_k=16)
    for i, n in enumerate(n_kv.tolist()):
        tail = list(range(4 * (n // 4), n))
        assert set(tail) <= set(ids[i, : int(width[i])].tolist())


def test_reference_scores_a_window_row_as_its_one_row_step():
    """A verify window's query rows (up to 4) score their blocks bit for bit as plain decoding's one-row step does
    (issue 10's exactness; einsum over the rows folded them into one GEMM of another summation order: 2 heads of 16
    over 6 keys differed on every row under torch 2.13's CPU GEMM)."""
    g = torch.Generator().manual_seed(8)
    q = torch.randn(4, 2, 16, generator=g)
    keys, dead = torch.randn(5, 16, generator=g), torch.randn(16, generator=g)
    n_kv = torch.tensor([17, 18, 19, 20])
    window = block_scores_ref(q, keys, dead, n_kv)
    for r in range(4):
        assert torch.equal(window[r], block_scores_ref(q[r:r + 1], keys, dead, n_kv[r:r + 1])[0])


def test_block_scores_kernel_matches_reference():
    g = torch.Generator().manual_seed(6)
    n_q, dk, n_blocks = 7, 128, 150
    q = torch.randn(n_q, 4, dk, generator=g)
    keys, dead = torch.randn(n_blocks, dk, generator=g), torch.randn(dk, generator=g)
    n_kv = torch.tensor([1, 4, 5, 302, 600, 601, 603])
    want = block_scores_ref(q, keys, dead, n_kv)
    got = block_scores_triton(q.to(DEVICE), keys.to(DEVICE), dead.to(DEVICE), n_kv.to(DEVICE)).cpu()
    assert got.shape == (n_q, n_blocks + 1)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    finite = torch.isfinite(want)
    torch.testing.assert_close(got[finite], want[finite], rtol=1e-5, atol=1e-4)
    assert want[3, 302 // 4] == want[3, 302 // 4] and want[3, 302 // 4] > 1e8  # partial tail: +1e9
    assert want[4, 150] < 1e8 and torch.isinf(want[0, 1:]).all()  # whole blocks only: no bonus


def test_pooled_keys():
    g = torch.Generator().manual_seed(7)
    raw, w = torch.randn(12, 128, generator=g), torch.rand(128, generator=g) + 0.5
    keys = pool_block_keys(raw, w, first_block=2)
    assert keys.dtype == torch.float32 and keys.shape == (3, 128)
    mean = raw.double().reshape(3, 4, 128).mean(1)
    normed = mean / torch.sqrt(mean.square().mean(-1, keepdim=True) + 1e-6) * w.double()
    for b in range(3):
        pos = 4 * (b + 2)
        angle = pos * 1e7 ** (-torch.arange(32, dtype=torch.float64) / 32)
        x = normed[b]
        want = torch.cat([x[:32] * angle.cos() - x[32:64] * angle.sin(), x[32:64] * angle.cos() + x[:32] * angle.sin(),
                          x[64:]])
        torch.testing.assert_close(keys[b].double(), want, rtol=1e-6, atol=1e-6)
    d = dead_key(raw[0], w)
    torch.testing.assert_close(d.double(), rope_neox(d.double(), torch.tensor(0)))


@pytest.mark.skipif(DEVICE != "cuda", reason="512K cells: a GPU-only size (the CPU cases above cover every branch)")
def test_kernel_at_half_a_million_cells():
    g = torch.Generator().manual_seed(8)
    n_kv = torch.tensor([524288, 524287, 524285, 300001])
    scores = (torch.randn(4, 524288 // 4 + 1, generator=g) * 8).round() / 8  # coarse: many ties at the threshold
    want = select_cells_ref(scores.cuda(), n_kv.cuda())
    got = select_cells_triton(scores.cuda(), n_kv.cuda())
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
