"""The official openai client against a real server process: chat and completions, streaming, logprobs, tools."""

from __future__ import annotations

import json
import math

import httpx
import openai
import pytest

import strata

MESSAGES = [{"role": "user", "content": "Say something about rivers."}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def scripted(scripted_server):
    return openai.OpenAI(base_url=scripted_server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_models_list_and_retrieve(client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("other")


def test_chat_whole_and_streamed_agree(client):
    whole = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0)
    choice = whole.choices[0]
    assert whole.object == "chat.completion" and choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length") and isinstance(choice.message.content, str)
    assert whole.usage.completion_tokens <= 8 and whole.usage.total_tokens == whole.usage.prompt_tokens + \
        whole.usage.completion_tokens

    stream = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text == choice.message.content and finishes == [choice.finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_usage_reports_the_prompt_tokens_taken_from_the_cache(client):
    first = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3, temperature=0)
    again = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3, temperature=0)
    # The same prompt again: all but its last token come from the cache.
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    follow = MESSAGES + [{"role": "assistant", "content": first.choices[0].message.content},
                         {"role": "user", "content": "And about lakes?"}]
    longer = client.chat.completions.create(model="tiny", messages=follow, max_tokens=2, temperature=0)
    assert first.usage.prompt_tokens - 3 <= longer.usage.prompt_tokens_details.cached_tokens
    assert longer.usage.prompt_tokens_details.cached_tokens < longer.usage.prompt_tokens


def test_seeded_sampling_repeats(client):
    kwargs = dict(model="tiny", messages=MESSAGES, max_tokens=6, temperature=1.0, top_p=1.0, seed=7)
    a = client.chat.completions.create(**kwargs).choices[0].message.content
    b = client.chat.completions.create(**kwargs).choices[0].message.content
    assert a == b


def test_chat_logprobs_are_the_models_and_consistent(client):
    out = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=6, temperature=0,
                                         logprobs=True, top_logprobs=3)
    entries = out.choices[0].logprobs.content
    assert len(entries) >= 1
    for entry in entries:
        assert len(entry.top_logprobs) == 3 and entry.logprob <= 0
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob >= entry.top_logprobs[2].logprob
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)  # greedy picks the most likely
    raw = b"".join(bytes(e.bytes) for e in entries)
    assert raw.decode("utf-8", errors="replace") == out.choices[0].message.content

    streamed = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=6, temperature=0,
                                              logprobs=True, top_logprobs=3, stream=True)
    streamed_lps = [e.logprob for c in streamed if c.choices and c.choices[0].logprobs
                    for e in c.choices[0].logprobs.content]
    assert streamed_lps == pytest.approx([e.logprob for e in entries], abs=1e-5)


def test_completions_echo_scores_the_prompt_as_lm_eval_reads_it(client, tool_model):
    prompt = "The river runs to the sea"
    out = client.completions.create(model="tiny", prompt=[prompt], max_tokens=1, temperature=0, echo=True,
                                    logprobs=1)
    choice = out.choices[0]
    lp = choice.logprobs
    llm = strata.LLM(tool_model, device="cpu")
    ids = llm.tokenize(prompt)
    assert choice.text.startswith(prompt) and len(lp.tokens) == len(ids) + 1
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.text_offset[: len(ids)] == [len(llm.detokenize(ids[:i])) for i in range(len(ids))]
    # lm-eval: sum(token_logprobs[ctxlen:-1]), and greedy when each token is its position's top entry.
    expected = [float(row.log_softmax(-1)[t]) for row, t in zip(llm.logits(ids).double(), ids[1:])]
    assert lp.token_logprobs[1 : len(ids)] == pytest.approx(expected, abs=1e-4)
    generated = lp.token_logprobs[-1]
    assert generated == pytest.approx(max(lp.top_logprobs[-1].values()))
    again = client.completions.create(model="tiny", prompt=[prompt], max_tokens=1, temperature=0, echo=True,
                                      logprobs=1)
    assert again.usage.prompt_tokens_details.cached_tokens == 0  # scoring reads the prompt whole, every time


def test_completions_batch_token_ids_and_stream(client):
    out = client.completions.create(model="tiny", prompt=[[10, 20, 30], [40, 50]], max_tokens=2, temperature=0)
    assert [c.index for c in out.choices] == [0, 1]
    assert out.usage.prompt_tokens == 5
    whole = client.completions.create(model="tiny", prompt="Once upon", max_tokens=5, temperature=0).choices[0]
    parts = list(client.completions.create(model="tiny", prompt="Once upon", max_tokens=5, temperature=0,
                                           stream=True))
    assert "".join(p.choices[0].text for p in parts) == whole.text
    assert parts[-1].choices[0].finish_reason == whole.finish_reason


def test_tool_calls_are_parsed_whole_and_streamed_name_first(scripted):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}}}}}]
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    out = scripted.chat.completions.create(model="scripted", messages=messages, tools=tools, max_tokens=200)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me check."
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}

    deltas = [c.choices[0].delta for c in scripted.chat.completions.create(
        model="scripted", messages=messages, tools=tools, max_tokens=200, stream=True) if c.choices]
    calls = [d.tool_calls[0] for d in deltas if d.tool_calls]
    assert calls[0].function.name == "get_weather" and calls[0].id and calls[0].function.arguments == ""
    assert json.loads("".join(c.function.arguments or "" for c in calls)) == {"city": "Paris"}
    assert "".join(d.content or "" for d in deltas).strip() == "Let me check."

    # The call and its result go back through the template; the answer follows the result.
    follow = messages + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"celsius": 21}'},
    ]
    final = scripted.chat.completions.create(model="scripted", messages=follow, tools=tools, max_tokens=200)
    assert final.choices[0].message.content == "It is 21 degrees in Paris."
    assert final.choices[0].finish_reason == "stop"


def test_reasoning_effort_reaches_the_template_and_thinking_comes_apart(scripted):
    from tests.serve.scripted_server import THOUGHT

    ask = dict(model="scripted", messages=[{"role": "user", "content": "Hi"}], max_tokens=200)
    default = scripted.chat.completions.create(**ask).choices[0].message
    assert default.content == "thinking default" and default.model_extra["reasoning_content"] == THOUGHT
    off = scripted.chat.completions.create(**ask, reasoning_effort="none").choices[0].message
    assert off.content == "thinking off" and off.model_extra.get("reasoning_content") is None
    on = scripted.chat.completions.create(**ask, reasoning_effort="high")
    assert on.choices[0].message.content == "thinking default"

    deltas = [c.choices[0].delta for c in scripted.chat.completions.create(**ask, stream=True) if c.choices]
    assert "".join(d.model_extra.get("reasoning_content") or "" for d in deltas) == THOUGHT
    assert "".join(d.content or "" for d in deltas) == "thinking default"
    first_answer = next(i for i, d in enumerate(deltas) if d.content)
    assert all(not d.model_extra.get("reasoning_content") for d in deltas[first_answer:])  # thinking comes first


def test_errors_are_openai_shaped_and_the_server_keeps_serving(client, server):
    url = server.url + "/v1/chat/completions"
    bad_json = httpx.post(url, content=b'{"model": "tiny", "messages": [', headers={"content-type": "application/json"})
    assert bad_json.status_code == 400 and "not valid JSON" in bad_json.json()["error"]["message"]

    wrong_type = httpx.post(url, json={"model": "tiny", "messages": MESSAGES, "max_tokens": "5"})
    assert wrong_type.status_code == 400 and wrong_type.json()["error"]["param"] == "max_tokens"
    not_a_list = httpx.post(url, json={"model": "tiny", "messages": "hello"})
    assert not_a_list.status_code == 400 and not_a_list.json()["error"]["type"] == "invalid_request_error"
    no_content = httpx.post(url, json={"model": "tiny", "messages": [{"role": "user"}], "max_tokens": 2})
    error = no_content.json()["error"]
    assert no_content.status_code == 400 and error["message"] == "messages.0: a user message needs its content"
    assert error["param"] == "messages.0"

    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-9", messages=MESSAGES, max_tokens=2)
    assert missing.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=0)
    with pytest.raises(openai.BadRequestError) as too_long:
        client.completions.create(model="tiny", prompt="river " * 5000, max_tokens=2)
    assert too_long.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2, temperature=-1)

    huge = httpx.post(url, content=b"x" * (9 << 20), headers={"content-type": "application/json"})
    assert huge.status_code == 413 and "limit" in huge.json()["error"]["message"]
    unknown_route = httpx.get(server.url + "/v1/nothing")
    assert unknown_route.status_code == 404 and "error" in unknown_route.json()

    ok = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2)
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_metrics_count_tokens_and_leave_the_expert_cache_rate_unset(client, server):
    client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2)
    text = httpx.get(server.url + "/metrics").text
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
              if line and not line.startswith("#")}
    assert values["strata_generated_tokens_total"] >= 1 and values["strata_prompt_tokens_total"] >= 1
    assert values["strata_queue_length"] == 0 and values["strata_decode_tokens_per_second"] >= 0
    assert math.isnan(values["strata_expert_cache_hit_rate"])
    assert any(k.startswith('strata_requests_total{endpoint="/v1/chat/completions",status="200"}') for k in values)
