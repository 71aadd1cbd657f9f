"""A test server whose engine reads the prompt for real but answers from a script: the tiny model's random weights
never write a tool call, and the tests need to see one parsed. `python scripted_server.py MODEL PORT`.

Answers: after a tool result, the weather; when tools are offered, a call to get_weather; otherwise whether the
template was asked to skip thinking (else it thinks first, in Qwen's <think> section). A prompt containing SLOW takes 1.5 s to read (keep-alive comments show); one containing CRAWL is read 8 tokens a
step at 50 ms a step (a long prompt a cancel can cut short)."""

from __future__ import annotations

import sys
import time

import uvicorn

from strata.api import LLM
from strata.serve.app import ServerConfig, create_app

THOUGHT = "The user greets me.\nI should greet back."
CALL = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def answer(prompt: str) -> str:
    last_turn = prompt.rsplit("<|im_start|>", 2)[-2]
    if "<tool_response>" in last_turn:
        return "It is 21 degrees in Paris."
    if '"get_weather"' in prompt:
        return CALL
    if prompt.endswith("<think>\n\n</think>\n\n"):
        return "thinking off"
    return f"<think>\n{THOUGHT}\n</think>\n\nthinking default"


def crawling(llm: LLM, prompt_ids: list[int]) -> None:
    """Read the prompt a step at a time, slowly, through the engine (so its progress hook runs between steps)."""
    forward = llm.engine.model.forward

    def slow_forward(ids, ctx):
        time.sleep(0.05)
        return forward(ids, ctx)

    llm.engine.model.forward, llm.engine.prefill_chunk = slow_forward, 8
    try:
        llm.engine.prefill(prompt_ids)
    finally:
        llm.engine.model.forward, llm.engine.prefill_chunk = forward, 512


def scripted(llm: LLM):
    def generate(prompt_ids, params, max_tokens, stop_ids=frozenset()):
        prompt = llm.detokenize(prompt_ids)
        if "CRAWL" in prompt:
            crawling(llm, prompt_ids)
        else:
            llm.engine.prefill(prompt_ids)
        if "SLOW" in prompt:
            time.sleep(1.5)
        ids = llm.tokenize(answer(prompt))[:max_tokens]
        yield from ids
        if len(ids) < max_tokens:
            yield min(stop_ids)

    return generate


def main() -> None:
    model, port = sys.argv[1], int(sys.argv[2])
    llm = LLM(model, device="cpu")
    llm.engine.generate = scripted(llm)
    config = ServerConfig(model_name="scripted", keepalive_seconds=0.3)
    uvicorn.run(create_app(llm, config), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
