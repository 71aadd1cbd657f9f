"""Softmax routing in one launch: the softmax over a token's router logits, its k largest probabilities (ties to
the lower expert id) and, if asked, their renormalisation, as `models.layers.route_topk` computes them in torch
(a dtype copy, a softmax, a top-k of two kernels, a sum and a division there)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def ordered_key(bits):
    """The int32 bits of float32 values -> int32 keys that order as the floats do (no NaN): the negatives' bits but
    the sign flipped; the map is its own inverse. In one warp an int32 max or min is one instruction (REDUX), a
    float max log2(32) dependent shuffles."""
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def first_max(key, index, BIG: tl.constexpr):
    """(the largest key, the smallest index holding it; BIG above every index)."""
    best = tl.max(key, axis=0)
    return best, tl.min(tl.where(key == best, index, BIG), axis=0)


@triton.jit
def _float_max(x):
    """The largest of fp32 x (no NaN), by `ordered_key`."""
    return ordered_key(tl.max(ordered_key(x.to(tl.int32, bitcast=True)), axis=0)).to(tl.float32, bitcast=True)


@triton.jit
def softmax_topk(x, e, live, K: tl.constexpr, NORMALIZE: tl.constexpr, BLOCK: tl.constexpr, KB: tl.constexpr):
    """Logits x [BLOCK] fp32 of experts e (`live` the real ones) -> (weights [KB], ids [KB] int64, slots): the
    softmax's k largest, ties to the lower id, renormalised if asked; slots >= K are padding."""
    top = _float_max(x)
    p = tl.exp(x - top)
    p = p / tl.sum(p, axis=0)
    p = tl.where(live, p, -1.0)
    # The passes compare p's bits as int32 (non-negative floats order as their bits; the padding's -1.0 is
    # negative): a warp's int32 max and min are one instruction each (REDUX) where a float max takes log2(32)
    # dependent shuffles, and the picks are the same.
    bits = p.to(tl.int32, bitcast=True)
    slots = tl.arange(0, KB)
    chosen_p = tl.zeros((KB,), tl.float32)
    chosen_id = tl.zeros((KB,), tl.int64)
    for j in tl.static_range(K):  # k passes of "largest left, lowest id among equals"
        best, pick = first_max(bits, e, BLOCK)
        chosen_p = tl.where(slots == j, best.to(tl.float32, bitcast=True), chosen_p)
        chosen_id = tl.where(slots == j, pick.to(tl.int64), chosen_id)
        bits = tl.where(e == pick, -1, bits)
    if NORMALIZE:
        chosen_p = chosen_p / tl.sum(tl.where(slots < K, chosen_p, 0.0), axis=0)
    return chosen_p, chosen_id, slots


@triton.jit
def _route_topk_kernel(logits_ptr, weights_ptr, ids_ptr, n_experts, K: tl.constexpr, NORMALIZE: tl.constexpr,
                       BLOCK: tl.constexpr, KB: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, BLOCK)
    live = e < n_experts
    x = tl.load(logits_ptr + row * n_experts + e, mask=live, other=float("-inf")).to(tl.float32)
    chosen_p, chosen_id, slots = softmax_topk(x, e, live, K, NORMALIZE, BLOCK, KB)
    tl.store(weights_ptr + row * K + slots, chosen_p, mask=slots < K)
    tl.store(ids_ptr + row * K + slots, chosen_id.to(ids_ptr.dtype.element_ty), mask=slots < K)


def route_topk_triton(router_logits: torch.Tensor, k: int, normalize: bool,
                      ids_dtype: torch.dtype = torch.int64) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] (any float dtype) -> (weights [T, k] float32, expert ids [T, k] of ids_dtype: int32
    is what the expert kernels read, int64 what torch's top-k gives)."""
    n_tokens, n_experts = router_logits.shape
    if not 1 <= k <= n_experts:
        raise ValueError(f"top-{k} of {n_experts} experts")
    logits = router_logits.contiguous()
    weights = torch.empty(n_tokens, k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(n_tokens, k, dtype=ids_dtype, device=logits.device)
    if n_tokens:
        _route_topk_kernel[(n_tokens,)](logits, weights, ids, n_experts, K=k, NORMALIZE=normalize,
                                        BLOCK=triton.next_power_of_2(n_experts), KB=triton.next_power_of_2(k),
                                        num_warps=4)
    return weights, ids
