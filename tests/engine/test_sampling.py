import pytest
import torch

from strata.engine.sampling import Sampler, SamplingParams
from strata.errors import StrataError

LOGITS = torch.tensor([1.0, 3.0, 2.5, -1.0, 0.5, 2.9])


def _draws(params, n=200, history=()):
    sampler = Sampler(params)
    return [sampler(LOGITS, list(history)) for _ in range(n)]


def test_greedy_is_argmax():
    assert set(_draws(SamplingParams(temperature=0), 5)) == {1}


def test_seed_makes_runs_identical_and_different_seeds_differ():
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, seed=123)
    assert _draws(params) == _draws(params)
    assert _draws(params) != _draws(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, seed=124))


def test_top_k_keeps_only_the_k_best():
    assert set(_draws(SamplingParams(temperature=5.0, top_k=2, top_p=1.0, seed=0))) == {1, 5}


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    probs = torch.softmax(LOGITS, 0)  # sorted: 1 (.37), 5 (.33), 2 (.22), ...
    assert probs[1] + probs[5] > 0.6
    assert set(_draws(SamplingParams(temperature=1.0, top_k=0, top_p=0.6, seed=0))) == {1, 5}
    assert set(_draws(SamplingParams(temperature=1.0, top_k=0, top_p=0.01, seed=0))) == {1}


def test_min_p_drops_tokens_below_a_share_of_the_best():
    probs = torch.softmax(LOGITS, 0)
    keep = {i for i in range(6) if probs[i] >= 0.5 * probs.max()}
    assert set(_draws(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.5, seed=0), 400)) == keep


def test_repetition_penalty_moves_greedy_off_a_seen_token():
    assert _draws(SamplingParams(temperature=0, repetition_penalty=1.5), 1, history=[1]) == [5]
    assert _draws(SamplingParams(temperature=0, repetition_penalty=1.0), 1, history=[1]) == [1]


def test_sampling_follows_the_distribution():
    draws = _draws(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, seed=5), 4000)
    freq = torch.bincount(torch.tensor(draws), minlength=6).float() / len(draws)
    assert torch.allclose(freq, torch.softmax(LOGITS, 0), atol=0.03)


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0), dict(min_p=2), dict(top_k=-3),
                                 dict(repetition_penalty=0), dict(seed="x"), dict(seed=1.5), dict(top_k=2.5),
                                 dict(temperature="hot"), dict(top_p=None), dict(seed=True)])
def test_bad_parameters_are_one_line_errors(bad):
    with pytest.raises(StrataError, match="sampling: "):
        SamplingParams(**bad)


def test_parameters_of_any_number_type_pass():
    import numpy as np

    assert SamplingParams(temperature=1, top_k=np.int64(5), top_p=np.float32(0.5), seed=np.int32(3)).top_k == 5


@pytest.mark.parametrize("params", [dict(top_k=20, top_p=0.8), dict(top_k=0, top_p=0.9, min_p=0.05),
                                    dict(top_k=50, top_p=1.0, min_p=0.2)], ids=["k-p", "p-minp", "k-minp"])
def test_the_draw_follows_the_distribution_the_filters_leave(params):
    """`draw` (top-k, top-p and min-p on the sorted candidates, one uniform a token) against `distribution` (the
    same filters over the whole vocabulary, the reference): 6,000 draws over a 1,000-token vocabulary."""
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(3)) * 2.0
    sampler = Sampler(SamplingParams(temperature=0.7, seed=1, **params))
    want = sampler.distribution(logits, [])
    want = want / want.sum()
    n = 6000
    freq = torch.bincount(torch.tensor([sampler(logits, []) for _ in range(n)]), minlength=1000).double() / n
    assert (freq[want == 0] == 0).all()  # nothing the filters drop
    se = (want * (1 - want) / n).sqrt().double()
    assert ((freq - want.double()).abs() <= 5 * se + 1e-12).all()
