"""Two conversations taking turns on one server: each follow-up restores its conversation's checkpoint, the usage
says how many prompt tokens were not read again, and /metrics counts them."""

from __future__ import annotations

import anthropic
import httpx
import openai


def _metrics(server) -> dict[str, float]:
    text = httpx.get(server.url + "/metrics", timeout=5).text
    return {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def test_alternating_conversations_restore_their_checkpoints(server):
    oa = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    an = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
    rivers = [{"role": "user", "content": "Rivers: where do they begin?"}]
    hills = [{"role": "user", "content": "Hills: how old are they?"}]
    previous, restored = {}, 0
    for turn in range(2):
        if turn == 1:  # a first turn may restore a short shared prefix left by other tests: count follow-ups only
            before = _metrics(server)
        out = oa.chat.completions.create(model="tiny", messages=rivers, max_tokens=3, temperature=0)
        if turn:  # the whole previous prompt (and more) came from the checkpoint, the new message was read
            assert previous["rivers"] <= out.usage.prompt_tokens_details.cached_tokens < out.usage.prompt_tokens
            restored += out.usage.prompt_tokens_details.cached_tokens
        previous["rivers"] = out.usage.prompt_tokens
        rivers += [{"role": "assistant", "content": out.choices[0].message.content},
                   {"role": "user", "content": "And then?"}]

        reply = an.messages.create(model="tiny", max_tokens=3, messages=hills, extra_body={"temperature": 0})
        usage = reply.usage
        if turn:
            assert previous["hills"] <= usage.cache_read_input_tokens and usage.input_tokens >= 1
            restored += usage.cache_read_input_tokens
        previous["hills"] = usage.input_tokens + usage.cache_read_input_tokens
        hills += [{"role": "assistant", "content": "".join(b.text for b in reply.content)},
                  {"role": "user", "content": "Why?"}]

    after = _metrics(server)
    assert after["strata_checkpoint_restores_total"] - before["strata_checkpoint_restores_total"] == 2
    counted = after["strata_prompt_checkpoint_tokens_total"] - before["strata_prompt_checkpoint_tokens_total"]
    assert counted == restored  # each follow-up's cached tokens came from its checkpoint
    assert 1 <= after["strata_checkpoints"] <= 8 and after["strata_checkpoint_bytes"] > 0
    assert server.monitor()["last"]["checkpoint_tokens"] >= 1
