"""STRATA_LOGPOS records and the API's per-token logprobs and cancellation, on the tiny model."""

import math

import pytest
import torch

from strata import switches
from strata.eval.logpos import Record, read_records, score

PROMPT = "The quick brown fox"


def test_a_record_survives_its_line_exactly():
    record = score(torch.tensor([0.5, 2.0, -1.0, 1.25]), pos=7, target=3, top_k=3)
    assert record.top1 == 1 and [i for i, _ in record.top] == [1, 3, 0]
    assert math.isclose(sum(math.exp(lp) for _, lp in score(torch.zeros(4), 0, 0, 4).top), 1.0)
    assert Record.parse(record.line()) == record
    assert len(score(torch.zeros(8), 0, 0, 0).top) == 0


def test_logprobs_do_not_change_the_tokens_and_match_the_logits(tiny_llm):
    plain = tiny_llm.generate(PROMPT, max_tokens=6, temperature=0)
    scored = tiny_llm.generate(PROMPT, max_tokens=6, temperature=0, logprobs=4)
    assert scored.token_ids == plain.token_ids and plain.logprobs is None
    assert [lp.token for lp in scored.logprobs] == scored.token_ids
    ids = tiny_llm.tokenize(PROMPT) + scored.token_ids
    rows = torch.log_softmax(tiny_llm.logits(ids).double(), dim=-1)
    n = len(tiny_llm.tokenize(PROMPT))
    for i, lp in enumerate(scored.logprobs):
        assert lp.logprob == pytest.approx(float(rows[n - 1 + i, lp.token]), abs=1e-4)
        assert len(lp.top) == 4 and lp.top[0][0] == lp.token  # greedy takes the likeliest


def test_cancel_ends_the_stream_at_the_next_token(tiny_llm):
    seen = []
    chunks = tiny_llm.generate(PROMPT, max_tokens=50, temperature=0, stop=[], stream=True,
                               cancel=lambda: len(seen) >= 3)
    for chunk in chunks:
        seen.append(chunk)
    last = seen[-1]
    assert last.finish_reason == "cancelled" and last.stats.completion_tokens <= 4


def test_logpos_records_every_scored_position(tiny_llm, tmp_path):
    path = tmp_path / "run.logpos"
    prompt = tiny_llm.tokenize(PROMPT)
    with switches.override(STRATA_LOGPOS=str(path), STRATA_LOGPOS_TOPK=5):
        out = tiny_llm.generate(prompt, max_tokens=5, temperature=0)
    records = read_records(path)
    assert sorted(records) == list(range(len(prompt), len(prompt) + out.stats.completion_tokens))
    for pos, token in zip(sorted(records), out.token_ids):
        record = records[pos]
        assert record.target == token == record.top1 and len(record.top) == 5
