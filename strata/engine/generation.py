"""Tokens to text for a request: incremental decoding, stop strings, finish reasons and timings."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from strata.engine.engine import Engine
from strata.engine.sampling import Sampler, SamplingParams


@dataclass
class Stats:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_seconds: float = 0.0
    decode_seconds: float = 0.0
    cached_tokens: int = 0  # prompt tokens not read again: from the live cache or a checkpoint
    checkpoint_tokens: int = 0  # those of them restored from a checkpoint of an earlier conversation

    @property
    def prompt_tokens_per_second(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        # The first completion token comes from the prompt pass; the rest are decode steps.
        steps = self.completion_tokens - 1
        return steps / self.decode_seconds if steps > 0 and self.decode_seconds else 0.0


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability under the model (full-precision logits, before temperature and penalties)
    and the `top` most likely tokens at its position, most likely first."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class Chunk:
    """A piece of streamed output; the last one has `finish_reason` ("stop", "length" or "cancelled") and the final
    stats (earlier ones carry the same object while it fills: prompt and cached tokens are known from the first).
    `logprobs` (when asked for) has one entry per id of `token_ids`; `stop_string` is the stop string that ended it."""

    text: str
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stats: Stats | None = None
    logprobs: list[TokenLogprob] | None = None
    stop_string: str | None = None


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    finish_reason: str
    stats: Stats
    logprobs: list[TokenLogprob] | None = None
    stop_string: str | None = None


def held_back(text: str, stops: list[str]) -> int:
    """How many trailing characters of `text` could still grow into a stop string."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest


def decode_step(engine: Engine, history: list[int]) -> torch.Tensor:
    """Logits [vocab] after `history`, whose tokens but the last the engine has just read: one token through
    (the engine's decode step, captured on CUDA, as Engine.generate takes it)."""
    cached = engine.cached_tokens
    if len(cached) == len(history) - 1 and (not cached or cached[-1] == history[-2]):
        return engine.decode(history[-1], len(history) - 1)[-1]
    return engine.prefill(history, checkpoint=False)[-1]


def _scored(logits: torch.Tensor, token: int, top_n: int) -> TokenLogprob:
    lp = torch.log_softmax(logits.detach().reshape(-1).to("cpu", torch.float64), dim=-1)
    top = ()
    if top_n > 0:
        values, ids = torch.topk(lp, min(top_n, lp.numel()))
        top = tuple(zip(ids.tolist(), values.tolist()))
    return TokenLogprob(token, float(lp[token]), top)


def _token_steps(engine: Engine, prompt_ids: list[int], params: SamplingParams, max_tokens: int,
                 stop_ids: frozenset[int], top_n: int | None) -> Iterator[tuple[int, TokenLogprob | None]]:
    """(token, its logprob when asked for) until a stop id, max_tokens or the end of the context. Without logprobs
    and STRATA_LOGPOS this is Engine.generate itself; with them, the same steps with the logits kept in sight."""
    from strata.eval.logpos import writer_from_switches

    logpos = writer_from_switches()
    if top_n is None and logpos is None:
        tokens = engine.generate(prompt_ids, params, max_tokens, stop_ids)
        try:
            yield from ((token, None) for token in tokens)
        finally:
            tokens.close()
        return
    sampler = Sampler(params)
    history = list(prompt_ids)
    logits = engine.prefill(history)[-1]
    for _ in range(max_tokens):
        token = sampler(logits, history)
        if logpos is not None:
            logpos.write(len(history), token, logits)
        history.append(token)
        yield token, None if top_n is None else _scored(logits, token, top_n)
        if token in stop_ids or len(history) >= engine.n_ctx:
            return
        logits = decode_step(engine, history)


def stream_completion(engine: Engine, prompt_ids: list[int], params: SamplingParams, max_tokens: int,
                      stop: list[str] | None = None, stop_ids: frozenset[int] | None = None, *,
                      top_logprobs: int | None = None, cancel: Callable[[], bool] | None = None) -> Iterator[Chunk]:
    """Chunks of text as tokens come. `top_logprobs`: None for no logprobs, else each token's logprob and that many
    alternatives. `cancel`: asked before each step; when it says yes, the stream ends with finish "cancelled"."""
    tokenizer = engine.tokenizer
    stops = [s for s in (stop or []) if s]
    stop_ids = tokenizer.eos_token_ids if stop_ids is None else stop_ids
    decoder = tokenizer.stream_decoder(skip_special_tokens=True)  # control tokens are not text
    reuse = engine.reuse(prompt_ids)  # what the engine's prefill will take from its cache or a checkpoint
    stats = Stats(prompt_tokens=len(prompt_ids), cached_tokens=reuse.tokens,
                  checkpoint_tokens=reuse.tokens if reuse.checkpoint is not None else 0)
    pending, pending_ids, pending_lps = "", [], []
    keep_lps = top_logprobs is not None
    finish, matched = "length", None
    started = time.perf_counter()
    if cancel is not None and cancel():
        yield Chunk("", [], finish_reason="cancelled", stats=stats, logprobs=[] if keep_lps else None)
        return
    steps = _token_steps(engine, prompt_ids, params, max_tokens, stop_ids, top_logprobs)
    for token, logprob in steps:
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
        if keep_lps:
            pending_lps.append(logprob)
        hit = min(((pending.find(s), s) for s in stops if s in pending), default=None)
        if hit is not None:
            pending, finish, matched = pending[: hit[0]], "stop", hit[1]
            break
        keep = held_back(pending, stops)
        if len(pending) > keep:
            yield Chunk(pending[: len(pending) - keep], pending_ids, logprobs=pending_lps if keep_lps else None,
                        stats=stats)
            pending, pending_ids, pending_lps = pending[len(pending) - keep :], [], []
        if cancel is not None and cancel():
            finish = "cancelled"
            break
    steps.close()
    if stats.completion_tokens:
        stats.decode_seconds = time.perf_counter() - decode_started
    if finish == "length":
        pending += decoder.finish()
    yield Chunk(pending, pending_ids, finish_reason=finish, stats=stats,
                logprobs=pending_lps if keep_lps else None, stop_string=matched)


def complete(engine: Engine, prompt_ids: list[int], params: SamplingParams, max_tokens: int,
             stop: list[str] | None = None, *, top_logprobs: int | None = None,
             cancel: Callable[[], bool] | None = None) -> Completion:
    text, ids, lps = [], [], []
    for chunk in stream_completion(engine, prompt_ids, params, max_tokens, stop, top_logprobs=top_logprobs,
                                   cancel=cancel):
        text.append(chunk.text)
        ids.extend(chunk.token_ids)
        lps.extend(chunk.logprobs or [])
        if chunk.finish_reason:
            return Completion("".join(text), ids, chunk.finish_reason, chunk.stats,
                              lps if top_logprobs is not None else None, chunk.stop_string)
    raise AssertionError("stream ended without a finish reason")
