"""Choosing the next token: greedy, or seeded sampling with temperature, top-k, top-p, min-p, repetition penalty."""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral, Real

import torch

from strata.errors import StrataError, number_of_kind
from strata.kernels.sample import argmax, draw


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.7  # 0 means greedy
    top_k: int = 20  # 0 means off
    top_p: float = 0.8
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    def __post_init__(self):
        for name, kind in (("temperature", Real), ("top_k", Integral), ("top_p", Real), ("min_p", Real),
                           ("repetition_penalty", Real), ("seed", Integral)):
            value = getattr(self, name)
            if not (number_of_kind(value, kind) or name == "seed" and value is None):
                raise StrataError(f"sampling: {name} must be {'an integer' if kind is Integral else 'a number'}, "
                                  f"got {value!r}")
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
        # float32, as the draw kernel takes its scalars: both draw forms then compare with the same numbers
        self.top_p, self.min_p = (float(torch.tensor(v, dtype=torch.float32)) for v in (params.top_p, params.min_p))

    def __call__(self, logits: torch.Tensor, history: list[int]) -> int:
        """The next token after `history`, read on the host."""
        return int(self.pick(self.penalized(logits, history)))

    def pick(self, logits: torch.Tensor) -> torch.Tensor:
        """The next token as a one-element long tensor on the logits' device, not read (a step queued ahead takes it
        there: engine/decode_ahead.py); logits float32 [vocab], any penalty applied. Greedy: the argmax, on the
        logits' own device (copying and cloning 150K floats on the host cost a GPU decode step 4.5 ms, more than the
        step; argmax takes the first maximum on every device, so the token is the same). Else one token of the
        candidates top-k, top-p and min-p keep, by the inverse of their cumulative distribution (in vocabulary
        order) at one uniform of the seeded generator, drawn on the host as the call is made (`draw_reference`; one
        launch on a GPU). The vocabulary's probabilities copied to the host and drawn by torch.multinomial had taken
        ~4.3 ms a token (session 18, A3B on the H200: 2.4x the step)."""
        p = self.params
        if p.greedy:
            token = argmax.argmax_triton(logits) if logits.is_cuda else None  # one launch; torch's index
            return torch.argmax(logits).reshape(1) if token is None else token
        scaled = logits / p.temperature
        if 0 < p.top_k < scaled.numel():
            values, ids = torch.topk(scaled, p.top_k)  # sorted, the largest first
        else:
            values, ids = torch.sort(scaled, descending=True)
        u = float(torch.rand((), generator=self.generator))  # float32, as top_p and min_p
        if values.is_cuda and values.numel() <= draw.MAX_K:  # draw_reference's ops as one launch
            return draw.draw(values, ids, self.top_p, self.min_p, u)
        return draw_reference(values, ids, self.top_p, self.min_p, u)

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


def draw_reference(values: torch.Tensor, ids: torch.Tensor, top_p: float, min_p: float, u: float) -> torch.Tensor:
    """`Sampler.pick`'s draw (kernels/sample/draw.py's reference): over candidates `values` (logits over the
    temperature, sorted, the largest first) and their `ids`, the top-p prefix and the min-p cut (decided in that
    order), then, in vocabulary order, the first kept candidate whose cumulative probability (float64) passes u times
    the kept mass; one-element, not read. Vocabulary order, as torch.multinomial's: logits that differ in their last
    bits (another chunking, another device) move the draw's boundaries by as little, where an order by probability
    would let two near-equal candidates swap whole intervals."""
    probs = torch.softmax(values.double(), dim=-1)
    keep = torch.full((), probs.numel(), dtype=torch.long, device=probs.device)
    if top_p < 1.0:  # the smallest prefix whose mass reaches top_p (the first always stays)
        keep = torch.minimum(keep, ((torch.cumsum(probs, 0) - probs) < top_p).sum())
    if min_p > 0:
        keep = torch.minimum(keep, (probs >= min_p * probs[0]).sum())
    kept = torch.where(torch.arange(probs.numel(), device=probs.device) < keep.clamp(min=1), probs, 0.0)
    order = torch.argsort(ids)
    cumulative = torch.cumsum(kept[order], 0)  # unkept candidates add intervals of width 0: never drawn
    at = torch.searchsorted(cumulative, cumulative[-1:] * u, right=True).clamp(max=probs.numel() - 1)
    return ids[order].index_select(0, at)
