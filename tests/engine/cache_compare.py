"""Shared checks of the speculation tests: a cache after rolled-back verify windows against plain decoding's."""

from __future__ import annotations

import torch


def assert_close(ours: torch.Tensor, ref: torch.Tensor, bound: float = 1e-5) -> None:
    assert (ours - ref).abs().max() <= bound * ref.abs().max()


def assert_same_hybrid_state(a, b) -> None:
    """Every GatedDeltaNet conv and recurrent state, and every attention layer's keys and values up to the cache's
    length, of hybrid cache `a` within the bound of `b`'s."""
    for layer in a.conv:
        assert_close(a.conv[layer], b.conv[layer])
        assert_close(a.state[layer], b.state[layer])
    for layer in a.kv_slot:
        for x, y in zip(a.read(layer, a.length, torch.float32), b.read(layer, b.length, torch.float32)):
            assert_close(x, y)
