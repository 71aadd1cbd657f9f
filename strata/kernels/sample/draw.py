"""One sampled token from the top-k candidates in one launch, the rest of `Sampler.pick`'s torch ops fused.

`Sampler.pick` (engine/sampling.py) draws over the candidates `torch.topk` returns (the logits over the temperature,
sorted, the largest first): softmax over them in float64, their cumulative sums, the top-p prefix (the
smallest reaching top_p; the first always stays) and the min-p cut, then the first candidate whose cumulative sum
passes u times the kept mass, u one uniform of the request's seeded generator. In torch that is ~14 launches after
the top-k (session 18 on the H200: a sampled A3B token 1.90 ms against greedy's 1.79, decoding one step ahead);
here it is one program over the k <= MAX_K candidates. Float64 throughout, as the reference; the sums' order
differs from torch's, so a draw can differ from it only where u times the mass falls within float64 rounding of a
cumulative sum (tests: the same tokens as the reference over many draws). Built for sm_90 without spills (25
registers at 20 candidates, 71 at 1,024); not yet timed on a GPU (session 18's device time was spent).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_K = 1024  # candidates one program takes (the default top-k is 20); wider top-k stays with torch


@triton.jit
def _draw_kernel(values, ids, out, n, top_p, min_p, u, BLOCK: tl.constexpr, TOP_P: tl.constexpr,
                 MIN_P: tl.constexpr):
    at = tl.arange(0, BLOCK)
    live = at < n
    scaled = tl.load(values + at, mask=live, other=float("-inf")).to(tl.float64)
    e = tl.where(live, tl.exp(scaled - tl.max(scaled, axis=0)), 0.0)
    probs = e / tl.sum(e, axis=0)
    cumulative = tl.cumsum(probs, axis=0)
    keep = tl.sum(live.to(tl.int32), axis=0)  # n, as a tensor (a launch with n == 1 specializes it to a constant)
    if TOP_P:  # the smallest prefix whose mass reaches top_p (the first always stays)
        keep = tl.minimum(keep, tl.sum((live & (cumulative - probs < top_p)).to(tl.int32), axis=0))
    if MIN_P:
        cut = min_p * tl.max(probs, axis=0)
        keep = tl.minimum(keep, tl.sum((live & (probs >= cut)).to(tl.int32), axis=0))
    last = tl.maximum(keep, 1) - 1
    target = tl.sum(tl.where(at == last, cumulative, 0.0), axis=0) * u  # (u float32, promoted)
    # searchsorted(right): how many kept sums lie at or below the target
    pos = tl.minimum(tl.sum(((cumulative <= target) & (at <= last)).to(tl.int32), axis=0), last)
    token = tl.sum(tl.where(at == pos, tl.load(ids + at, mask=live, other=0), 0), axis=0)
    tl.store(out, token)


def draw(values: torch.Tensor, ids: torch.Tensor, top_p: float, min_p: float, u: float) -> torch.Tensor:
    """The drawn candidate's id as a one-element long tensor on their device (not read): values [k] the candidates'
    logits over the temperature, sorted (the largest first), ids [k] theirs, k <= MAX_K; u a float32 uniform."""
    k = values.numel()
    if not 0 < k <= MAX_K:
        raise ValueError(f"draw takes 1..{MAX_K} candidates, got {k}")
    out = torch.empty(1, dtype=torch.long, device=values.device)
    _draw_kernel[(1,)](values, ids, out, k, top_p, min_p, u, BLOCK=triton.next_power_of_2(k),
                       TOP_P=top_p < 1.0, MIN_P=min_p > 0, num_warps=warps_for(k))
    return out


def warps_for(k: int) -> int:
    """One warp up to 128 candidates (its reductions stay in the warp), four past."""
    return 1 if k <= 128 else 4
