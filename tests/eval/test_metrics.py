"""The quality metrics on hand-built records whose answers are known."""

import math

import pytest

from strata.eval.logpos import Record
from strata.eval.metrics import compare, kl_topk, table


def rec(pos, target, probs: dict[int, float]) -> Record:
    top = tuple(sorted(((i, math.log(p)) for i, p in probs.items()), key=lambda t: -t[1]))
    return Record(pos, target, dict(top)[target] if target in probs else math.log(1e-6), top[0][0], top[0][1], top)


def test_kl_of_identical_records_is_zero():
    a = rec(0, 1, {1: 0.5, 2: 0.3, 3: 0.1})
    assert kl_topk(a, a) == 0.0
    c = compare({0: a, 1: a}, {0: a, 1: a})
    assert c.kl == 0 and c.argmax_agreement == 1 and c.delta_nll == 0 and c.delta_nll_se == 0
    assert c.perplexity_a == c.perplexity_b == pytest.approx(2.0)


def test_kl_matches_the_formula_with_a_shared_rest_bucket():
    a = rec(0, 1, {1: 0.6, 2: 0.3})  # rest 0.1
    b = rec(0, 1, {1: 0.3, 2: 0.6})  # rest 0.1
    expected = 0.6 * math.log(0.6 / 0.3) + 0.3 * math.log(0.3 / 0.6) + 0.1 * math.log(0.1 / 0.1)
    assert kl_topk(a, b) == pytest.approx(expected)


def test_an_id_b_does_not_list_gets_its_share_of_bs_unlisted_mass():
    a = rec(0, 1, {1: 0.5, 2: 0.4})
    b = rec(0, 1, {1: 0.5, 3: 0.45})  # unlisted mass 0.05, one missing id: min(0.45, 0.05 / 2)
    q2 = 0.025
    q_rest = 1 - 0.5 - q2
    expected = 0.4 * math.log(0.4 / q2) + 0.1 * math.log(0.1 / q_rest)
    assert kl_topk(a, b) == pytest.approx(expected)


def test_agreement_decisive_positions_perplexity_and_paired_delta():
    a = {0: rec(0, 1, {1: 0.9, 2: 0.05}), 1: rec(1, 2, {1: 0.5, 2: 0.45}), 2: rec(2, 1, {1: 0.7, 3: 0.2})}
    b = {0: rec(0, 1, {1: 0.8, 2: 0.1}), 1: rec(1, 2, {2: 0.5, 1: 0.45}), 2: rec(2, 1, {1: 0.6, 3: 0.3}),
         3: rec(3, 1, {1: 1.0})}  # position 3 is B's alone: not counted
    c = compare(a, b)
    assert c.positions == 3 and c.argmax_agreement == pytest.approx(2 / 3)
    # A's top-2 gaps: log(0.9/0.05) and log(0.7/0.2) are decisive, log(0.5/0.45) is not; B agrees on both.
    assert (c.decisive_agree, c.decisive_total) == (2, 2)
    assert c.perplexity_a == pytest.approx(math.exp(-(math.log(0.9) + math.log(0.45) + math.log(0.7)) / 3))
    deltas = [math.log(0.9 / 0.8), math.log(0.45 / 0.5), math.log(0.7 / 0.6)]
    mean = sum(deltas) / 3
    se = math.sqrt(sum((d - mean) ** 2 for d in deltas) / 2 / 3)
    assert c.delta_nll == pytest.approx(mean) and c.delta_nll_se == pytest.approx(se)
    assert c.first_token_kl == pytest.approx(kl_topk(a[0], b[0]))
    assert "| A vs B | 3 | 66.7 % |" in table([("A vs B", c)])


def test_positions_with_different_targets_do_not_count():
    a = {0: rec(0, 1, {1: 0.9, 2: 0.1})}
    with pytest.raises(ValueError, match="no position"):
        compare(a, {0: rec(0, 2, {1: 0.9, 2: 0.1})})
