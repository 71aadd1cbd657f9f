"""Choosing the next token: greedy, or seeded sampling with temperature, top-k, top-p, min-p, repetition penalty."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from strata.errors import StrataError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.7  # 0 means greedy
    top_k: int = 20  # 0 means off
    top_p: float = 0.8
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    def __post_init__(self):
        checks = [
            (self.temperature >= 0, "temperature must be >= 0"),
            (self.top_k >= 0, "top_k must be >= 0"),
            (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (0 <= self.min_p <= 1, "min_p must be in [0, 1]"),
            (self.repetition_penalty > 0, "repetition_penalty must be > 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise StrataError(f"sampling: {message}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class Sampler:
    """Draws tokens for one request; a fixed seed gives the same tokens run after run."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.generator = torch.Generator(device="cpu")
        if params.seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(params.seed)

    def __call__(self, logits: torch.Tensor, history: list[int]) -> int:
        if self.params.greedy:
            # On the logits' own device: one integer comes back, not the vocabulary (copying and cloning 150K
            # floats on the host cost a GPU decode step 4.5 ms, more than the step). argmax takes the first
            # maximum on every device, so the token is the same.
            return int(torch.argmax(self.penalized(logits, history)))
        probs = self.distribution(logits, history)
        return int(torch.multinomial(probs / probs.sum(), 1, generator=self.generator))

    def penalized(self, logits: torch.Tensor, history: list[int]) -> torch.Tensor:
        """float32 [vocab] on the logits' device, the repetition penalty applied (a copy then: logits may be a
        view of a decoder's static buffer)."""
        p = self.params
        logits = logits.detach().float().reshape(-1)
        if p.repetition_penalty != 1.0 and history:
            logits = logits.clone()
            seen = torch.tensor(sorted(set(history)), dtype=torch.long).to(logits.device, non_blocking=True)
            scores = logits[seen]
            logits[seen] = torch.where(scores > 0, scores / p.repetition_penalty, scores * p.repetition_penalty)
        return logits

    def distribution(self, logits: torch.Tensor, history: list[int]) -> torch.Tensor:
        """The unnormalized probabilities [vocab] this sampler draws from (for sampling, not greedy): penalty,
        temperature, top-k, top-p and min-p applied, on the host (the seeded draws read them there). Speculative
        sampling compares two of these."""
        p = self.params
        # Shaped on the logits' device (a GPU sorts the vocabulary in microseconds), then one copy to the host.
        logits = self.penalized(logits, history) / p.temperature
        if 0 < p.top_k < logits.numel():
            kth = torch.topk(logits, p.top_k).values[-1]
            logits[logits < kth] = float("-inf")
        probs = torch.softmax(logits, dim=-1)
        if p.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            # Keep the smallest prefix whose mass reaches top_p; the first token always stays.
            drop = (torch.cumsum(sorted_probs, 0) - sorted_probs) >= p.top_p
            probs[order[drop]] = 0
        if p.min_p > 0:
            probs[probs < p.min_p * probs.max()] = 0
        return probs.cpu()
