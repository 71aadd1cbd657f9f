"""A bounded soak: 200 mixed requests (16-17 of each of 12 kinds) from 8 concurrent clients on loopback; every
answer well formed, the server healthy and idle at the end."""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor

import anthropic
import httpx
import openai

N_REQUESTS, N_CLIENTS, N_KINDS = 200, 8, 12
PROMPTS = ["Hello", "Tell me a story.", "What is a river?", "Name three colours.", "Bonjour !"]


def one_request(kind: int, seed: int, url: str) -> str:
    rng = random.Random(seed)
    oa = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
    an = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": rng.choice(PROMPTS)}]
    n = rng.randint(1, 6)
    if kind == 0:
        out = oa.chat.completions.create(model="tiny", messages=messages, max_tokens=n, seed=seed)
        assert isinstance(out.choices[0].message.content, str) and out.usage.completion_tokens <= n
    elif kind == 1:
        chunks = list(oa.chat.completions.create(model="tiny", messages=messages, max_tokens=n, stream=True,
                                                 stream_options={"include_usage": True}))
        assert chunks[-1].usage.completion_tokens <= n
        assert sum(1 for c in chunks if c.choices and c.choices[0].finish_reason) == 1
    elif kind == 2:
        out = oa.completions.create(model="tiny", prompt=messages[0]["content"], max_tokens=1, echo=True,
                                    logprobs=2, temperature=0)
        lp = out.choices[0].logprobs
        assert lp.token_logprobs[0] is None and all(v <= 0 for v in lp.token_logprobs[1:])
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    elif kind == 3:
        out = an.messages.create(model="tiny", max_tokens=n, messages=messages)
        assert out.stop_reason in ("end_turn", "max_tokens") and out.usage.output_tokens <= n
    elif kind == 4:
        with an.messages.stream(model="tiny", max_tokens=n, messages=messages) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert text == "".join(b.text for b in final.content if b.type == "text")
    elif kind == 5:
        try:
            oa.chat.completions.create(model="nope", messages=messages, max_tokens=n)
            raise AssertionError("an unknown model was served")
        except openai.NotFoundError as error:
            assert error.body["code"] == "model_not_found"
    elif kind == 6:
        out = oa.chat.completions.create(model="tiny", messages=messages, max_tokens=n, logprobs=True,
                                         top_logprobs=2)
        assert all(len(e.top_logprobs) == 2 for e in out.choices[0].logprobs.content)
    elif kind == 7:  # a client that leaves after the first event
        with httpx.stream("POST", url + "/v1/chat/completions", timeout=120, json={
                "model": "tiny", "messages": messages, "max_tokens": 50, "stream": True}) as r:
            first = next(line for line in r.iter_lines() if line.startswith("data:"))
            json.loads(first.removeprefix("data:"))
    elif kind == 8:
        bad = httpx.post(url + "/v1/chat/completions", json={"model": "tiny", "messages": messages,
                                                             "max_tokens": -1}, timeout=120)
        assert bad.status_code == 400 and "max_tokens" in bad.json()["error"]["message"]
    elif kind == 9:
        out = oa.completions.create(model="tiny", prompt=[[10, 20, 30]], max_tokens=n, temperature=0.5, seed=seed)
        assert out.choices[0].finish_reason in ("stop", "length")
    elif kind == 10:  # a follow-up: its history comes from the live cache or a checkpoint, unless others pushed it out
        first = oa.chat.completions.create(model="tiny", messages=messages, max_tokens=n)
        follow = messages + [{"role": "assistant", "content": first.choices[0].message.content},
                             {"role": "user", "content": "Go on."}]
        out = oa.chat.completions.create(model="tiny", messages=follow, max_tokens=n)
        assert 0 <= out.usage.prompt_tokens_details.cached_tokens < out.usage.prompt_tokens
    else:
        ids = httpx.post(url + "/tokenize", json={"prompt": messages[0]["content"]}, timeout=120).json()["tokens"]
        text = httpx.post(url + "/detokenize", json={"tokens": ids}, timeout=120).json()["prompt"]
        assert text == messages[0]["content"]
    return str(kind)


def test_soak_mixed_requests_from_concurrent_clients(server):
    before = server.wait_idle()["totals"]["requests"]
    with ThreadPoolExecutor(N_CLIENTS) as pool:
        futures = [pool.submit(one_request, i % N_KINDS, i, server.url) for i in range(N_REQUESTS)]
        done = [f.result() for f in futures]  # re-raises the first failure
    assert len(done) == N_REQUESTS
    state = server.wait_idle(timeout=30)
    assert state["totals"]["requests"] - before >= N_REQUESTS and state["totals"]["rejected"] == 0
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    out = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Still there?"}], max_tokens=2)
    assert out.choices[0].finish_reason in ("stop", "length")
