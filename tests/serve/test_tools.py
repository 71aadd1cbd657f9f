"""Qwen-format tool calls in streamed text: found across any split, bad blocks left as text."""

import json

import pytest

from strata.serve.tools import ToolCall, ToolCallParser, parse_call, split_calls

REPLY = ('Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
         '<tool_call>{"name": "get_time", "arguments": "{\\"zone\\": \\"CET\\"}"}</tool_call>')


def feed_in_pieces(text: str, size: int) -> list:
    parser = ToolCallParser()
    items = []
    for i in range(0, len(text), size):
        items += parser.feed(text[i : i + size])
    return items + parser.finish()


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_calls_are_found_whatever_the_pieces(size):
    items = feed_in_pieces(REPLY, size)
    calls = [i for i in items if isinstance(i, ToolCall)]
    assert [c.name for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0].arguments) == {"city": "Paris"} and json.loads(calls[1].arguments) == {"zone": "CET"}
    assert "".join(i for i in items if isinstance(i, str)).strip() == "Checking."
    assert calls[0].id != calls[1].id


def test_text_that_only_looks_like_a_tag_start_is_released():
    parser = ToolCallParser()
    assert parser.feed("a <tool") == ["a "]
    assert parser.feed("box> b") == ["<toolbox> b"]


def test_bad_blocks_stay_text_and_an_unclosed_call_counts_at_the_end():
    assert split_calls("<tool_call>not json</tool_call>") == ("<tool_call>not json</tool_call>", [])
    assert parse_call('{"arguments": {}}') is None and parse_call('["get"]') is None
    text, calls = split_calls('<tool_call>{"name": "f", "arguments": {"x": 1}}')
    assert text == "" and calls[0].name == "f" and json.loads(calls[0].arguments) == {"x": 1}
    assert split_calls("<tool_call>{oops") == ("<tool_call>{oops", [])
    assert split_calls("plain reply ") == ("plain reply ", [])
