"""Tokens to text for a request: incremental decoding, stop strings, finish reasons and timings."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

from strata.engine.engine import Engine
from strata.engine.sampling import SamplingParams


@dataclass
class Stats:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_seconds: float = 0.0
    decode_seconds: float = 0.0

    @property
    def prompt_tokens_per_second(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        # The first completion token comes from the prompt pass; the rest are decode steps.
        steps = self.completion_tokens - 1
        return steps / self.decode_seconds if steps > 0 and self.decode_seconds else 0.0


@dataclass
class Chunk:
    """A piece of streamed output; the last one has `finish_reason` ("stop" or "length") and the stats."""

    text: str
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stats: Stats | None = None


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    finish_reason: str
    stats: Stats


def held_back(text: str, stops: list[str]) -> int:
    """How many trailing characters of `text` could still grow into a stop string."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest


def stream_completion(engine: Engine, prompt_ids: list[int], params: SamplingParams, max_tokens: int,
                      stop: list[str] | None = None, stop_ids: frozenset[int] | None = None) -> Iterator[Chunk]:
    tokenizer = engine.tokenizer
    stops = [s for s in (stop or []) if s]
    stop_ids = tokenizer.eos_token_ids if stop_ids is None else stop_ids
    decoder = tokenizer.stream_decoder(skip_special_tokens=True)  # control tokens are not text
    stats = Stats(prompt_tokens=len(prompt_ids))
    pending, pending_ids = "", []
    finish = "length"
    started = time.perf_counter()
    tokens = engine.generate(prompt_ids, params, max_tokens, stop_ids)
    for token in tokens:
        now = time.perf_counter()
        if stats.completion_tokens == 0:
            stats.prompt_seconds = now - started
            decode_started = now
        stats.completion_tokens += 1
        if token in stop_ids:
            finish = "stop"
            break
        pending += decoder.push(token)
        pending_ids.append(token)
        hit = min((pending.find(s) for s in stops if s in pending), default=-1)
        if hit >= 0:
            pending, finish = pending[:hit], "stop"
            break
        keep = held_back(pending, stops)
        if len(pending) > keep:
            yield Chunk(pending[: len(pending) - keep], pending_ids)
            pending, pending_ids = pending[len(pending) - keep :], []
    tokens.close()
    if stats.completion_tokens:
        stats.decode_seconds = time.perf_counter() - decode_started
    if finish == "length":
        pending += decoder.finish()
    yield Chunk(pending, pending_ids, finish_reason=finish, stats=stats)


def complete(engine: Engine, prompt_ids: list[int], params: SamplingParams, max_tokens: int,
             stop: list[str] | None = None) -> Completion:
    text, ids = [], []
    for chunk in stream_completion(engine, prompt_ids, params, max_tokens, stop):
        text.append(chunk.text)
        ids.extend(chunk.token_ids)
        if chunk.finish_reason:
            return Completion("".join(text), ids, chunk.finish_reason, chunk.stats)
    raise AssertionError("stream ended without a finish reason")
