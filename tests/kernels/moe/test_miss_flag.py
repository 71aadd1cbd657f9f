"""STRATA_MISSES_SKIP's predicate (`kernels/moe/miss_flag.py`): the one-program launch under Triton's interpreter
against its torch definition, and the conditional wrapper's form outside a capture (the misses always run)."""

import torch

from strata.kernels.moe.miss_flag import any_missed, launch_any_missed


def test_the_flag_launch_matches_its_definition(device):
    missing = torch.tensor([-1, 1, -1, 3, -1, -1], dtype=torch.int32)
    for ids, want in (([[0, 2], [4, 5]], False), ([[0, 2], [3, 5]], True), ([[1, 0, 2]], True), ([[5]], False)):
        ids = torch.tensor(ids, dtype=torch.int32)
        assert bool(any_missed(ids, missing)) is want
        flag = launch_any_missed(ids.to(device), missing.to(device))
        assert flag.dtype == torch.bool and bool(flag) is want, ids


def test_outside_a_capture_the_misses_always_run():
    from strata.engine.direct_misses import only_if_missed

    calls = []
    like = torch.zeros(1, 4)
    got = only_if_missed(torch.zeros(1, 2, dtype=torch.int32), torch.full((3,), -1, dtype=torch.int32), like,
                         lambda: calls.append(1) or torch.ones(1, 4))
    assert calls == [1] and torch.equal(got, torch.ones(1, 4))
