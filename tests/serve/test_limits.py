"""What keeps the server healthy: cancellation on disconnect, the bounded queue, API keys, keep-alive comments."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import anthropic
import httpx
import openai
import pytest

from strata.cli import main
from tests.serve.conftest import API_KEY

# Greedy on the tiny model loops without ever choosing an end token: a long reply that only a cancel ends.
LONG = {"model": "tiny", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 3000,
        "temperature": 0}


def read_until_content(lines, n: int = 1) -> None:
    seen = 0
    for line in lines:
        if line.startswith("data:") and '"content": "' in line and '"content": ""' not in line:
            seen += 1
            if seen >= n:
                return
    raise AssertionError("the stream ended before any content")


def test_a_stream_whose_client_leaves_is_cancelled_at_the_next_token(server):
    before = server.wait_idle()["totals"]["cancelled"]
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={**LONG, "stream": True}, timeout=30) as r:
        read_until_content(r.iter_lines(), 3)
    state = server.wait_idle(timeout=10)
    assert state["totals"]["cancelled"] == before + 1
    assert state["last"]["finish_reason"] == "cancelled" and state["last"]["completion_tokens"] < 3000


def test_a_client_that_leaves_while_its_long_prompt_is_read_stops_it_at_the_next_chunk(scripted_server):
    words = "CRAWL " + "the river runs to the sea " * 60  # about 50 steps of 50 ms
    body = {"model": "scripted", "messages": [{"role": "user", "content": words}], "max_tokens": 5, "stream": True}
    with httpx.stream("POST", scripted_server.url + "/v1/chat/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data:"))
        deadline = time.monotonic() + 10
        while not ((current := scripted_server.monitor()["current"]) or {}).get("prompt_read"):
            assert time.monotonic() < deadline, "the prompt never started"
            time.sleep(0.02)
    # The client has left with the prompt part read.
    state = scripted_server.wait_idle(timeout=10)
    last = state["last"]
    assert last["finish_reason"] == "cancelled" and last["completion_tokens"] == 0
    assert 0 < last["prompt_tokens"] < current["prompt_to_read"]  # the tokens read before it stopped
    ok = httpx.post(scripted_server.url + "/v1/chat/completions", json={**body, "stream": False, "max_tokens": 200},
                    timeout=30).json()  # the next request reads the prompt whole and answers
    assert ok["choices"][0]["message"]["content"] == "thinking default"
    assert ok["usage"]["prompt_tokens"] == current["prompt_to_read"]


def test_a_waiting_client_that_times_out_is_cancelled_too(server):
    before = server.wait_idle()["totals"]["cancelled"]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/chat/completions", json=LONG, timeout=1.5)
    state = server.wait_idle(timeout=10)
    assert state["totals"]["cancelled"] == before + 1 and state["last"]["completion_tokens"] < 3000


def test_past_the_queue_requests_get_429_with_retry_after(strict_server):
    url, headers = strict_server.url + "/v1/chat/completions", strict_server.headers
    client = openai.OpenAI(base_url=strict_server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)
    small = {**LONG, "max_tokens": 2}
    with ThreadPoolExecutor(1) as pool, httpx.stream("POST", url, json={**LONG, "stream": True}, headers=headers,
                                                     timeout=30) as running:
        lines = running.iter_lines()  # kept: a collected line iterator closes the stream
        read_until_content(lines)  # one request runs...
        waiting = pool.submit(httpx.post, url, json=small, headers=headers, timeout=30)
        deadline = time.monotonic() + 10
        while strict_server.monitor()["queue_length"] < 1:  # ...one waits...
            assert time.monotonic() < deadline, "the second request never queued"
            time.sleep(0.02)
        refused = httpx.post(url, json=small, headers=headers)  # ...and the next is refused
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["code"] == "queue_full"
        with pytest.raises(openai.RateLimitError):
            client.chat.completions.create(**small)
    assert waiting.result().status_code == 200  # the first client left; the waiting one was served
    metrics = httpx.get(strict_server.url + "/metrics", headers=headers).text
    assert "strata_requests_rejected_queue_full_total 2.0" in metrics


def test_api_key_is_required_and_compared_whole(strict_server):
    url = strict_server.url
    ask = {**LONG, "max_tokens": 1}
    assert httpx.get(url + "/health").status_code == 200 and httpx.get(url + "/").status_code == 200
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {API_KEY}x"},
                    {"Authorization": f"Bearer {API_KEY[:-1]}"}, {"x-api-key": "wrong"}):
        refused = httpx.post(url + "/v1/chat/completions", json=ask, headers=headers)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(url + "/metrics").status_code == 401 and httpx.get(url + "/monitor").status_code == 401
    assert httpx.get(url + "/v1/models").status_code == 401
    no_key = httpx.post(url + "/v1/messages", json={"model": "tiny", "max_tokens": 1, "messages": ask["messages"]})
    assert no_key.status_code == 401 and no_key.json()["error"]["type"] == "authentication_error"

    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "/v1", api_key="nope", max_retries=0).models.list()
    ok = openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0).chat.completions.create(**ask)
    assert ok.choices[0].message.content is not None
    message = anthropic.Anthropic(base_url=url, api_key=API_KEY, max_retries=0).messages.create(
        model="tiny", max_tokens=1, messages=ask["messages"])
    assert message.usage.output_tokens == 1


def test_refuses_to_listen_beyond_loopback_without_a_key(tiny_moe, capsys):
    assert main(["serve", str(tiny_moe), "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--api-key" in err
    assert main(["serve", str(tiny_moe), "--host", "::", "--api-key", "short"]) == 2
    assert "at least 8" in capsys.readouterr().err


def test_keep_alive_comments_flow_while_a_slow_prompt_is_read(scripted_server):
    body = {"model": "scripted", "messages": [{"role": "user", "content": "SLOW please"}], "max_tokens": 200,
            "stream": True}
    with httpx.stream("POST", scripted_server.url + "/v1/chat/completions", json=body, timeout=30) as r:
        lines = [line for line in r.iter_lines() if line]
    first_content = next(i for i, line in enumerate(lines) if '"content": "' in line and '"content": ""' not in line)
    assert any(line.startswith(":") for line in lines[:first_content])  # SSE comments: ignored by clients
    assert lines[-1] == "data: [DONE]"
    json.loads(lines[first_content].removeprefix("data: "))
