"""The one-launch greedy token (kernels/sample/argmax.py) against torch.argmax: the first largest logit, over
chunks, ties, NaN, signed zeros and lengths that are not a multiple of a program's chunk."""

import pytest
import torch

from strata.kernels.attention.decode_short import arrival_counters
from strata.kernels.sample.argmax import CHUNK, argmax_triton
from tests.kernels import DEVICE


def _cases():
    gen = torch.Generator().manual_seed(5)
    vocab = 3 * CHUNK + 123  # four programs, the last one partly filled
    random = torch.randn(vocab, generator=gen)
    tie_across = random.clone()
    tie_across[[CHUNK + 7, 2 * CHUNK + 1, 40]] = 9.0  # equal maxima in three chunks: the first index
    tie_within = random.clone()
    tie_within[[CHUNK + 9, CHUNK + 3]] = 9.0  # in one chunk
    nan = random.clone()
    nan[3 * CHUNK + 100] = float("nan")
    nan[2 * CHUNK + 5] = -float("nan")  # a NaN with its sign bit set, first: torch takes any NaN as the largest
    assert nan[2 * CHUNK + 5].view(torch.int32) < 0
    zeros = -torch.rand(vocab, generator=gen) - 0.1
    zeros[[CHUNK + 1, 17]] = torch.tensor([0.0, -0.0])  # -0.0 first equals 0.0
    return {"random": random, "tie across chunks": tie_across, "tie within a chunk": tie_within, "nan": nan,
            "signed zeros": zeros, "all -inf": torch.full((vocab,), float("-inf")), "last": torch.arange(700.0),
            "one": torch.tensor([3.0])}


@pytest.mark.parametrize("case", list(_cases()))
def test_the_first_largest_logit_as_torch(case):
    logits = _cases()[case].to(DEVICE)
    got = argmax_triton(logits)
    assert got.dtype == torch.long and got.shape == (1,)
    assert got.item() == torch.argmax(logits).item()
    assert int(arrival_counters(logits.device, 1)[0]) == 0  # left zero for the next launch


def test_what_the_kernel_does_not_take_goes_to_torch():
    assert argmax_triton(torch.ones(4, dtype=torch.float64, device=DEVICE)) is None
    assert argmax_triton(torch.empty(0, device=DEVICE)) is None
