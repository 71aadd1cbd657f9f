"""Decode one step ahead: the next step queued before the host reads this step's token.

In the plain loop (Engine.generate) the device idles while the host takes a token: the wait's wake-up, the token's
choice and read, the loop's Python, the token's upload, the graph's launch and whatever the consumer does between
tokens (A3B all resident: the step's device time 1.76 ms, a token every 1.85-1.90 ms). Here each step's token is
chosen on the device (`Sampler.pick`: the argmax, or the seeded draw whose uniform the host takes in the loop's
order), the next step reads it there (`GraphDecoder.step`'s `head`) and is queued at once, and the host reads the
token (pinned memory, an event) while that next step runs: the device goes from step to step without waiting for
the host. The tokens are the loop's: the same choice over the same logits.

The price: when a token turns out to be a stop id, the step after it has already run, and the cache holds the stop
too. The engine's record says so (`cached_tokens` ends with the stop), so the next prompt starts after it where it
continues the conversation (a chat's next turn does: the stop closes the reply) and rewinds where it does not: an
attention cache by truncating, a recurrent state (which cannot be rewound) from a checkpoint or from the start, as
for any prompt that leaves the live sequence. Repetition penalties keep the plain loop (they read the tokens so far
on the host), as do speculative decoding, experts behind a cache (the host is inside each step) and qwen4exp (its
n-gram rows are hashed from the tokens on the host).
"""

from __future__ import annotations

from typing import Iterator

import torch

from strata import switches
from strata.engine.decode import GraphDecoder
from strata.engine.sampling import Sampler, SamplingParams


def runs_ahead(engine, params: SamplingParams) -> bool:
    """Whether `engine.generate` takes this loop: STRATA_DECODE_AHEAD 1 (the default) for captured steps, 2 for the
    uncaptured static step too (the CPU's: tests), 0 never; no repetition penalty, every step on the device."""
    mode = switches.get("STRATA_DECODE_AHEAD")
    decoder = engine.decoder
    return (bool(mode) and isinstance(decoder, GraphDecoder) and decoder.takes_head and decoder.cached is None
            and decoder.rows == 1 and (decoder.capture or mode == 2) and engine.spec is None
            and params.repetition_penalty == 1.0)


class TokenReadback:
    """One step's token: chosen on the device, copied into pinned host memory behind it."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.on_device: torch.Tensor | None = None
        self.host = torch.zeros(1, dtype=torch.long, pin_memory=self.cuda)
        self.copied = torch.cuda.Event() if self.cuda else None

    def queue(self, logits: torch.Tensor, sampler: Sampler) -> None:
        """The token the sampler picks from logits' last row and its copy, queued on the stream."""
        self.on_device = sampler.pick(sampler.penalized(logits[-1], []))  # (no penalty: the history is not read)
        self.host.copy_(self.on_device, non_blocking=self.cuda)
        if self.cuda:
            self.copied.record()

    def read(self) -> int:
        if self.cuda:
            self.copied.synchronize()
        return int(self.host[0])


def generate_ahead(engine, sampler: Sampler, first: int, history: list[int], max_tokens: int,
                   stop_ids: frozenset[int]) -> Iterator[int]:
    """Engine.generate's tokens after the prompt's (`first`, the sampler's from the prompt's logits; `history` the
    prompt), each decode step queued before the host has read the token it takes."""
    if max_tokens <= 0:
        return
    decoder = engine.decoder
    # Two in turn: a step's copy to the host must not overwrite the token the host has not read yet.
    readbacks = (TokenReadback(decoder.device), TokenReadback(decoder.device))
    history.append(first)
    yield first
    if first in stop_ids or len(history) >= engine.n_ctx or max_tokens == 1:
        return
    pending = _queue(engine, sampler, readbacks[0], len(history) - 1, token=first)
    produced, turn = 1, 1
    while True:
        # The token `pending` will give is yielded; its own step is queued now, before the host reads it, unless
        # max_tokens or the context's end leaves no use for it.
        wanted = produced + 1 < max_tokens and len(history) + 1 < engine.n_ctx
        after = _queue(engine, sampler, readbacks[turn % 2], len(history), head=pending.on_device) if wanted \
            else None
        token = pending.read()
        history.append(token)
        produced += 1
        if after is not None:
            engine.cached_tokens.append(token)  # its step, queued above, wrote it at position len(history) - 1
        yield token
        if token in stop_ids or after is None:
            return
        pending, turn = after, turn + 1


def _queue(engine, sampler: Sampler, readback: TokenReadback, position: int, token: int = 0,
           head: torch.Tensor | None = None) -> TokenReadback:
    """One decode step at `position` (its token known on the host, or `head` on the device) and its pick."""
    readback.queue(engine.decoder.step([token], position, head=head), sampler)
    del engine.cached_tokens[position:]  # in place, as Engine.decode
    if head is None:
        engine.cached_tokens.append(token)
    return readback
