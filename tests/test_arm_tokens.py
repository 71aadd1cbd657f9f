"""tools/device/arm_tokens.py: an A/B arm's greedy tokens and logits (here the repository's package on the CPU, the
tiny qwen3moe) saved, and two arms' records compared: where the tokens part, and the logits over the steps that
were fed the same tokens only."""

import pytest
import torch

from tools.device.arm_tokens import compare, generate

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _record(tokens, logits):
    return {"tokens": tokens, "logits": torch.tensor(logits), "graphs": False, "package": "arm"}


def test_an_arm_compared_with_itself_is_equal_to_the_byte(tiny_moe, capsys):
    record = generate(str(tiny_moe), 4, "float16", "cpu")
    assert len(record["tokens"]) == 4 and record["logits"].shape[0] == 4
    assert compare(record, generate(str(tiny_moe), 4, "float16", "cpu"))  # the CPU's decode repeats its bytes
    assert "tokens equal (4 steps" in capsys.readouterr().out


def test_arms_that_part_are_reported_at_the_first_differing_step(capsys):
    base = _record([5, 6, 7, 8], [[1.0, 4.0], [2.0, 1.0], [3.0, 0.0], [9.0, 0.0]])
    other = _record([5, 6, 2, 3], [[1.0, 4.0], [2.0, 1.0], [2.5, 3.0], [0.0, 9.0]])
    assert not compare(base, other)
    out = capsys.readouterr().out
    # the steps up to the first differing pick (3 of them): the largest difference 3.0 of the largest |logit| 4.0
    assert "differ from step 2" in out and "within 7.500e-01" in out and "first 3 steps" in out
    assert "bytes differ" in out
