"""The one-launch sampled draw (kernels/sample/draw.py) under Triton's interpreter against its torch reference
(engine/sampling.draw_reference): the same token over random candidates, filters and uniforms, the edges included."""

import os

import pytest
import torch

from strata.engine.sampling import draw_reference
from strata.kernels.sample import draw

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="CPU tensors take Triton only interpreted")


@pytest.mark.parametrize("k", [1, 2, 20, 33, 64])
@pytest.mark.parametrize("top_p, min_p", [(1.0, 0.0), (0.8, 0.0), (1.0, 0.1), (0.9, 0.05), (1e-9, 0.0)])
def test_the_draw_is_the_references(k, top_p, min_p):
    top_p, min_p = (float(torch.tensor(v, dtype=torch.float32)) for v in (top_p, min_p))  # as Sampler.pick passes
    gen = torch.Generator().manual_seed(k * 31 + int(top_p * 10) + int(min_p * 100))
    for trial in range(6):
        values = (torch.randn(k, generator=gen) * (0.5 + trial)).sort(descending=True).values
        ids = torch.randperm(50_000, generator=gen)[:k]
        for u in (0.0, float(torch.rand((), generator=gen)), float(torch.rand((), generator=gen)), 0.99999994):
            got = draw.draw(values, ids, top_p, min_p, u)
            want = draw_reference(values, ids, top_p, min_p, u)
            assert got.shape == (1,) and got.dtype == torch.long
            assert int(got) == int(want), (k, top_p, min_p, trial, u)


def test_ties_and_the_limit():
    values = torch.zeros(8)  # eight equal candidates: u picks among them in vocabulary order
    ids = torch.arange(100, 108)
    assert [int(draw.draw(values, ids.flip(0), 1.0, 0.0, u)) for u in (0.0, 0.13, 0.5, 0.99)] == [100, 101, 104, 107]
    with pytest.raises(ValueError, match="1..64 candidates"):
        draw.draw(torch.zeros(draw.MAX_K + 1), torch.arange(draw.MAX_K + 1), 1.0, 0.0, 0.5)
