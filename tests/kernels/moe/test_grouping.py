import pytest
import torch

from strata.kernels.moe.grouping import group_pairs, group_pairs_ref, group_pairs_triton, max_tiles_for


def skewed_ids(n_tokens: int, top_k: int, n_experts: int, seed: int = 0) -> torch.Tensor:
    """Distinct experts per token, experts 0-1 in every token, the last four never chosen."""
    g = torch.Generator().manual_seed(seed)
    rest = torch.stack([torch.randperm(n_experts - 6, generator=g)[: top_k - 2] + 2 for _ in range(n_tokens)])
    return torch.cat([torch.tensor([[0, 1]]).expand(n_tokens, 2), rest], dim=1).int()


def check_layout(grouping, ids: torch.Tensor) -> None:
    """Every pair placed exactly once, in its expert's rows, and the tile list covering exactly those rows."""
    n_tokens, top_k = ids.shape
    flat = ids.reshape(-1).long().cpu()
    counts = torch.bincount(flat, minlength=grouping.n_experts)
    assert torch.equal(grouping.counts.cpu().long(), counts)
    starts = grouping.starts.cpu().long()
    size = grouping.tile_rows
    tiles = (counts + size - 1) // size
    assert torch.equal(starts[1:] - starts[:-1], tiles * size)
    assert starts[0] == 0 and (starts % size == 0).all()
    rows = grouping.pair_row.cpu().long()
    assert rows.unique().numel() == rows.numel()  # no row given twice
    assert ((rows >= starts[flat]) & (rows < starts[flat] + counts[flat])).all()
    row_token = grouping.row_token.cpu().long()
    assert torch.equal(row_token[rows], torch.arange(flat.numel()) // top_k)
    used = torch.zeros_like(row_token, dtype=torch.bool)
    used[rows] = True
    assert (row_token[~used] == -1).all()
    n_tiles = int(grouping.n_tiles.item())
    assert n_tiles == int(tiles.sum()) <= grouping.max_tiles
    tile_expert = grouping.tile_expert.cpu().long()
    assert torch.equal(tile_expert[:n_tiles], torch.repeat_interleave(torch.arange(grouping.n_experts), tiles))
    assert (tile_expert[n_tiles:] == -1).all()
    assert row_token.numel() == grouping.max_tiles * size


@pytest.mark.parametrize("shape", [(256, 10, 64), (37, 8, 512), (1, 1, 4), (200, 4, 5), (64, 1, 1)])
def test_grouping_places_every_pair_once(device, shape):
    n_tokens, top_k, n_experts = shape
    g = torch.Generator().manual_seed(n_tokens)
    ids = torch.stack([torch.randperm(n_experts, generator=g)[:top_k] for _ in range(n_tokens)]).int()
    for grouping in (group_pairs_triton(ids.to(device), n_experts), group_pairs_ref(ids, n_experts)):
        check_layout(grouping, ids)


def test_grouping_skewed_routing_matches_reference(device):
    ids = skewed_ids(256, 10, 64)
    got, ref = group_pairs_triton(ids.to(device), 64), group_pairs_ref(ids, 64)
    check_layout(got, ids)
    for field in ("counts", "starts", "tile_expert", "n_tiles"):
        assert torch.equal(getattr(got, field).cpu(), getattr(ref, field)), field
    assert got.counts[60:].sum() == 0 and int(got.n_tiles) == 4 + 4 + 58  # experts 0, 1: 256 rows each; 2-59 under 64


def test_grouping_in_128_row_tiles(device):
    ids = skewed_ids(200, 6, 16)
    got, ref = group_pairs_triton(ids.to(device), 16, 128), group_pairs_ref(ids, 16, 128)
    for grouping in (got, ref):
        check_layout(grouping, ids)
        assert grouping.tile_rows == 128 and grouping.max_rows == grouping.max_tiles * 128
    assert torch.equal(got.tile_expert.cpu(), ref.tile_expert) and int(got.n_tiles) == 2 + 2 + 10


def test_max_tiles_bound_is_tight():
    assert max_tiles_for(64, 1) == 1 and max_tiles_for(65, 1) == 2
    assert max_tiles_for(10, 512) == 10  # ten experts with one pair each
    assert max_tiles_for(20480, 512) == (20480 + 63 * 512) // 64
    assert max_tiles_for(128, 1, 128) == 1 and max_tiles_for(129, 1, 128) == 2


def test_dispatch_takes_reference_on_cpu():
    ids = skewed_ids(16, 4, 16)
    check_layout(group_pairs(ids, 16), ids)
