"""One sampled token from the top-k candidates in one launch, the rest of `Sampler.pick`'s torch ops fused.

`Sampler.pick` (engine/sampling.py) draws over the candidates `torch.topk` returns (the logits over the temperature,
sorted, the largest first): softmax over them in float64, the top-p prefix (the smallest reaching top_p; the first
always stays) and the min-p cut, then, in vocabulary order, the first kept candidate whose cumulative probability
passes u times the kept mass, u one uniform of the request's seeded generator (`draw_reference`). In torch that is
~16 launches after the top-k (session 18 on the H200: a sampled A3B token 1.90 ms against greedy's 1.79, decoding
one step ahead); here one program over the k <= MAX_K candidates, each candidate's cumulative probability in
vocabulary order summed over the candidates of smaller or equal id (k x k comparisons, no sort). Float64 as the
reference; the sums' order differs from torch's, so a draw can differ from it only where u times the mass falls
within float64 rounding of a cumulative sum (tests: the same tokens as the reference over many draws). Built for
sm_90 without spills. On the H200 (session 19, A3B, one step ahead): the reference's tokens, 1.870 ms a sampled
token against the torch form's 1.899 (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_K = 64  # candidates one program takes (k x k float64 sums; the default top-k is 20); wider top-k: torch


@triton.jit
def _draw_kernel(values, ids, out, n, top_p, min_p, u, BLOCK: tl.constexpr, TOP_P: tl.constexpr,
                 MIN_P: tl.constexpr):
    at = tl.arange(0, BLOCK)
    live = at < n
    scaled = tl.load(values + at, mask=live, other=float("-inf")).to(tl.float64)
    e = tl.where(live, tl.exp(scaled - tl.max(scaled, axis=0)), 0.0)
    probs = e / tl.sum(e, axis=0)
    keep = tl.sum(live.to(tl.int32), axis=0)  # n, as a tensor (a launch with n == 1 specializes it to a constant)
    if TOP_P:  # the smallest prefix whose mass reaches top_p (the first always stays)
        before = tl.cumsum(probs, axis=0) - probs
        keep = tl.minimum(keep, tl.sum((live & (before < top_p)).to(tl.int32), axis=0))
    if MIN_P:
        cut = min_p * tl.max(probs, axis=0)
        keep = tl.minimum(keep, tl.sum((live & (probs >= cut)).to(tl.int32), axis=0))
    kept = at < tl.maximum(keep, 1)
    p = tl.where(kept, probs, 0.0)
    token_ids = tl.load(ids + at, mask=live, other=0)
    # each candidate's cumulative probability in vocabulary order: the kept mass of ids up to its own
    up_to = token_ids[None, :] <= token_ids[:, None]
    cumulative = tl.sum(tl.where(up_to, p[None, :], 0.0), axis=1)
    target = tl.sum(p, axis=0) * u  # (u float32, promoted)
    # the kept candidate of smallest id whose cumulative sum passes the target (else, by rounding, the largest)
    hit = kept & (cumulative > target)
    first = tl.min(tl.where(hit, token_ids, 2**62), axis=0)
    token = tl.where(first == 2**62, tl.max(tl.where(kept, token_ids, -1), axis=0), first)
    tl.store(out, token)


def draw(values: torch.Tensor, ids: torch.Tensor, top_p: float, min_p: float, u: float) -> torch.Tensor:
    """The drawn candidate's id as a one-element long tensor on their device (not read): values [k] the candidates'
    logits over the temperature, sorted (the largest first), ids [k] theirs (int64), k <= MAX_K; u a float32
    uniform."""
    k = values.numel()
    if not 0 < k <= MAX_K:
        raise ValueError(f"draw takes 1..{MAX_K} candidates, got {k}")
    out = torch.empty(1, dtype=torch.long, device=values.device)
    _draw_kernel[(1,)](values, ids, out, k, top_p, min_p, u, BLOCK=triton.next_power_of_2(k),
                       TOP_P=top_p < 1.0, MIN_P=min_p > 0, num_warps=warps_for(k))
    return out


def warps_for(k: int) -> int:
    """One warp up to 32 candidates (its reductions stay in the warp), four past."""
    return 1 if k <= 32 else 4
