"""Quest selection: the bound (GEMM form vs Quest's elementwise float64 form, and truly a bound), the kept cells,
the top-k through kernels/select's Triton kernel equal to its reference."""

import torch

from strata.kernels.select.quest import block_bounds, quest_scores, quest_select, upper_bounds, upper_bounds_f64
from strata.kernels.select.topk import select_cells_ref, select_cells_triton
from tests.kernels import DEVICE

BLOCK, WINDOW = 8, 8


def _keys(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 2, 16, generator=g), torch.randn(5, 4, 16, generator=g)  # keys [n, Hkv, D], q [T, H, D]


def test_the_bound_is_quests_and_bounds_every_key():
    keys, q = _keys(70)
    kmin, kmax = block_bounds(keys, BLOCK)
    assert kmin.shape == (9, 2, 16)  # 70 cells: 8 full blocks and one of 6
    bound = upper_bounds(q, kmin, kmax)
    exact = upper_bounds_f64(q, kmin, kmax)
    assert (bound.double() - exact).abs().max() < 1e-4  # float32 GEMMs against float64 (values up to ~40)
    logits = torch.einsum("thd,chd->thc", q.double(), keys.double().repeat_interleave(2, 1))  # [T, H, cells]
    per_block = torch.nn.functional.pad(logits, (0, 2), value=float("-inf")).unflatten(2, (9, BLOCK)).amax(3)
    assert (per_block <= exact + 1e-9).all()


def test_the_first_block_and_the_window_are_always_kept():
    keys, q = _keys(200, seed=1)
    kmin, kmax = block_bounds(keys, BLOCK)
    n_kv = torch.tensor([10, 60, 120, 199, 200])
    ids, width = quest_select(q, kmin, kmax, n_kv, BLOCK, WINDOW, budget=40)
    assert width.tolist() == [10, 40, 40, 40, 40] and ids.shape == (5, 40)
    for i, n in enumerate(n_kv.tolist()):
        row = ids[i, : width[i]].tolist()
        assert row == sorted(set(row)) and all(0 <= c < n for c in row)
        assert set(range(BLOCK)) <= set(row) or n <= BLOCK
        assert set(range(max(0, n - WINDOW), n)) <= set(row)
        assert (ids[i, width[i]:] == -1).all()
    assert ids[0, :10].tolist() == list(range(10))  # a query that sees fewer cells than the budget keeps all


def test_a_key_the_query_points_at_is_found():
    keys, q = _keys(400, seed=2)
    q[:, :, :] = 0.1 * q
    keys[201] = 8 * q[0, ::2].mean(0).sign()[None]  # cell 201 (block 25) answers the query strongly
    kmin, kmax = block_bounds(keys, BLOCK)
    ids, width = quest_select(q[:1], kmin, kmax, torch.tensor([400]), BLOCK, WINDOW, budget=40)
    assert 201 in ids[0, : width[0]].tolist()


def test_the_triton_top_k_takes_the_same_cells_from_quest_scores():
    keys, q = _keys(300, seed=3)
    kmin, kmax = block_bounds(keys, BLOCK)
    n_kv = torch.tensor([37, 150, 151, 299, 300])
    scores = quest_scores(q, kmin, kmax, n_kv, BLOCK, WINDOW)
    scores[2, 10:20] = scores[2, 10]  # ties: the lowest index wins in both
    want = select_cells_ref(scores, n_kv, top_k=61)
    got = select_cells_triton(scores.to(DEVICE), n_kv.to(DEVICE), top_k=61)
    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])
