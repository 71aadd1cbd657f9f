"""The official anthropic client against a real server process: messages whole and streamed, tool use, errors."""

from __future__ import annotations

import anthropic
import httpx
import pytest

MESSAGES = [{"role": "user", "content": "Tell me about mountains."}]
GREEDY = {"temperature": 0}  # this client version sends sampling fields only as extra body


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def scripted(scripted_server):
    return anthropic.Anthropic(base_url=scripted_server.url, api_key="unused", max_retries=0, timeout=60)


def test_message_whole_and_streamed_agree(client):
    whole = client.messages.create(model="tiny", max_tokens=8, messages=MESSAGES, extra_body=GREEDY,
                                   system="You are terse.")
    assert whole.type == "message" and whole.role == "assistant" and whole.model == "tiny"
    assert whole.stop_reason in ("end_turn", "max_tokens") and whole.usage.output_tokens <= 8
    text = "".join(block.text for block in whole.content if block.type == "text")

    with client.messages.stream(model="tiny", max_tokens=8, messages=MESSAGES, extra_body=GREEDY,
                                system="You are terse.") as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text and final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    # The same prompt twice: all but its last token come from the cache.
    assert final.usage.cache_read_input_tokens == final.usage.input_tokens + final.usage.cache_read_input_tokens - 1


def test_max_tokens_and_stop_sequences(client):
    out = client.messages.create(model="tiny", max_tokens=1, messages=MESSAGES, extra_body=GREEDY)
    assert out.stop_reason in ("max_tokens", "end_turn") and out.usage.output_tokens == 1
    free = "".join(b.text for b in client.messages.create(model="tiny", max_tokens=30, messages=MESSAGES,
                                                          extra_body=GREEDY).content)
    if len(free) < 6:
        pytest.skip("the synthetic model ended too early to pick a stop sequence")
    stop = free[3:5]
    cut = client.messages.create(model="tiny", max_tokens=30, messages=MESSAGES, extra_body=GREEDY,
                                 stop_sequences=[stop])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert "".join(b.text for b in cut.content) == free[: free.index(stop)]


def test_tool_use_whole_and_streamed(scripted):
    tools = [{"name": "get_weather", "description": "Weather in a city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    out = scripted.messages.create(model="scripted", max_tokens=200, messages=messages, tools=tools)
    assert out.stop_reason == "tool_use"
    text, use = out.content
    assert text.type == "text" and text.text == "Let me check."
    assert use.type == "tool_use" and use.name == "get_weather" and use.input == {"city": "Paris"}

    with scripted.messages.stream(model="scripted", max_tokens=200, messages=messages, tools=tools) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["text", "tool_use"] and final.content[1].input == {"city": "Paris"}

    follow = messages + [
        {"role": "assistant", "content": [{"type": "text", "text": "Let me check."},
                                          {"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "21 C"}]},
    ]
    answer = scripted.messages.create(model="scripted", max_tokens=200, messages=follow, tools=tools)
    assert answer.content[0].text == "It is 21 degrees in Paris." and answer.stop_reason == "end_turn"


def test_thinking_switch_reaches_the_template_and_thinking_is_its_own_block(scripted):
    from tests.serve.scripted_server import THOUGHT

    ask = dict(model="scripted", max_tokens=200, messages=[{"role": "user", "content": "Hi"}])
    off = scripted.messages.create(**ask, thinking={"type": "disabled"})
    assert [b.type for b in off.content] == ["text"] and off.content[0].text == "thinking off"
    default = scripted.messages.create(**ask)
    assert [b.type for b in default.content] == ["thinking", "text"]
    assert default.content[0].thinking == THOUGHT and default.content[1].text == "thinking default"

    with scripted.messages.stream(**ask, thinking={"type": "enabled", "budget_tokens": 1024}) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == THOUGHT and final.content[1].text == "thinking default"
    assert events.count("content_block_stop") == 2


def test_errors_are_anthropic_shaped(client, server):
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="claude-9", max_tokens=4, messages=MESSAGES)
    assert missing.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        client.messages.create(model="tiny", max_tokens=0, messages=MESSAGES)
    no_max = httpx.post(server.url + "/v1/messages", json={"model": "tiny", "messages": MESSAGES})
    body = no_max.json()
    assert no_max.status_code == 400 and body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    bad_role = httpx.post(server.url + "/v1/messages", json={"model": "tiny", "max_tokens": 2,
                                                             "messages": [{"role": "robot", "content": "x"}]})
    assert bad_role.status_code == 400 and "role" in bad_role.json()["error"]["message"]
    assert client.messages.create(model="tiny", max_tokens=2, messages=MESSAGES).usage.output_tokens >= 1


def test_message_start_reports_the_prompt_tokens_read_and_those_from_the_cache(client):
    def first_event():
        with client.messages.create(model="tiny", max_tokens=2, messages=MESSAGES, extra_body=GREEDY,
                                    system="Count.", stream=True) as events:
            return next(iter(events))

    first_event()  # the prompt is now in the live cache
    start = first_event()
    assert start.type == "message_start"
    usage = start.message.usage
    # All but the prompt's last token come from the cache; the two together are the whole prompt.
    assert usage.cache_read_input_tokens >= 1 and usage.input_tokens == 1 and usage.output_tokens == 0


def test_count_tokens_is_the_prompt_that_messages_reads(client, server):
    """POST /v1/messages/count_tokens (the official client's messages.count_tokens): the rendered conversation's
    tokens, the whole prompt that /v1/messages then reads; tools shown to the template count; errors as there."""
    counted = client.messages.count_tokens(model="tiny", messages=MESSAGES, system="Count.")
    out = client.messages.create(model="tiny", max_tokens=1, messages=MESSAGES, system="Count.", extra_body=GREEDY)
    assert counted.input_tokens == out.usage.input_tokens + out.usage.cache_read_input_tokens > 0
    tools = [{"name": "get_weather", "description": "Weather in a city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    with_tools = client.messages.count_tokens(model="tiny", messages=MESSAGES, system="Count.", tools=tools)
    assert with_tools.input_tokens > counted.input_tokens
    with pytest.raises(anthropic.NotFoundError):
        client.messages.count_tokens(model="claude-9", messages=MESSAGES)
    empty = httpx.post(server.url + "/v1/messages/count_tokens", json={"model": "tiny", "messages": []})
    assert empty.status_code == 400 and empty.json()["error"]["type"] == "invalid_request_error"
