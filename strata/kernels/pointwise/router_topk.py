"""The router of a decode step in one launch: a token's router logits (x times the router matrix, rounded to x's
dtype as `linear` rounds them) and then the softmax routing of `route_topk.py`. Programs split the experts; each
writes its share of the logits and takes a ticket, and the program that takes the last ticket of its token reads
them all and picks the top k. Before: a cuBLAS GEMM and the routing kernel, two launches a layer."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

EXPERTS_PER_PROGRAM = 16
DIM_CHUNK = 256
_TICKETS: dict[torch.device, torch.Tensor] = {}


@triton.jit
def _router_topk_kernel(x_ptr, w_ptr, logits_ptr, tickets_ptr, weights_ptr, ids_ptr, n_experts, dim,
                        K: tl.constexpr, NORMALIZE: tl.constexpr, BE: tl.constexpr, BD: tl.constexpr,
                        BLOCK: tl.constexpr, KB: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    e = tl.program_id(1) * BE + tl.arange(0, BE)
    live_e = e < n_experts
    acc = tl.zeros((BE,), tl.float32)
    for d0 in range(0, dim, BD):
        d = d0 + tl.arange(0, BD)
        live_d = d < dim
        xv = tl.load(x_ptr + row * dim + d, mask=live_d, other=0.0).to(tl.float32)
        wv = tl.load(w_ptr + e[:, None].to(tl.int64) * dim + d[None, :], mask=live_e[:, None] & live_d[None, :],
                     other=0.0).to(tl.float32)
        acc += tl.sum(wv * xv[None, :], axis=1)
    # Stored in x's dtype: the logits are rounded where `linear` rounds them.
    tl.store(logits_ptr + row * n_experts + e, acc.to(logits_ptr.dtype.element_ty), mask=live_e)
    # acq_rel: this program's logits are visible to whoever takes a later ticket, and that one sees all before it.
    ticket = tl.atomic_add(tickets_ptr + row, 1)
    if ticket == tl.num_programs(1) - 1:
        tl.store(tickets_ptr + row, 0)  # the last one resets its token's counter for the next launch (or replay)
        a = tl.arange(0, BLOCK)
        live = a < n_experts
        x = tl.load(logits_ptr + row * n_experts + a, mask=live, other=float("-inf"), cache_modifier=".cg")
        x = x.to(tl.float32)
        top = tl.max(x, axis=0)
        p = tl.exp(x - top)
        p = p / tl.sum(p, axis=0)
        p = tl.where(live, p, -1.0)
        slots = tl.arange(0, KB)
        chosen_p = tl.zeros((KB,), tl.float32)
        chosen_id = tl.zeros((KB,), tl.int64)
        for j in tl.static_range(K):  # k passes of "largest left, lowest id among equals"
            best = tl.max(p, axis=0)
            pick = tl.min(tl.where(p == best, a, BLOCK), axis=0)
            chosen_p = tl.where(slots == j, best, chosen_p)
            chosen_id = tl.where(slots == j, pick.to(tl.int64), chosen_id)
            p = tl.where(a == pick, -1.0, p)
        if NORMALIZE:
            chosen_p = chosen_p / tl.sum(tl.where(slots < K, chosen_p, 0.0), axis=0)
        tl.store(weights_ptr + row * K + slots, chosen_p, mask=slots < K)
        tl.store(ids_ptr + row * K + slots, chosen_id.to(ids_ptr.dtype.element_ty), mask=slots < K)


def tickets(device: torch.device, n_tokens: int) -> torch.Tensor:
    """The per-token ticket counters (int32, zero between launches: the last program of a token resets its own):
    kept per device, so a captured step reads the same buffer every replay."""
    kept = _TICKETS.get(device)
    if kept is None or kept.numel() < n_tokens:
        kept = torch.zeros(max(n_tokens, 64), dtype=torch.int32, device=device)
        _TICKETS[device] = kept
    return kept


def router_topk_triton(x: torch.Tensor, router: torch.Tensor, k: int, normalize: bool,
                       ids_dtype: torch.dtype = torch.int64) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, D] and the router [E, D], both in x's dtype -> (weights [T, k] float32, expert ids [T, k] of
    ids_dtype), as `route_topk(linear(x, router), k, normalize)` computes them."""
    n_tokens, dim = x.shape
    n_experts = router.shape[0]
    if not 1 <= k <= n_experts:
        raise ValueError(f"top-{k} of {n_experts} experts")
    x, router = x.contiguous(), router.contiguous()
    logits = torch.empty(n_tokens, n_experts, dtype=x.dtype, device=x.device)
    weights = torch.empty(n_tokens, k, dtype=torch.float32, device=x.device)
    ids = torch.empty(n_tokens, k, dtype=ids_dtype, device=x.device)
    if n_tokens:
        grid = (n_tokens, triton.cdiv(n_experts, EXPERTS_PER_PROGRAM))
        _router_topk_kernel[grid](x, router, logits, tickets(x.device, n_tokens), weights, ids, n_experts, dim,
                                  K=k, NORMALIZE=normalize, BE=EXPERTS_PER_PROGRAM, BD=DIM_CHUNK,
                                  BLOCK=triton.next_power_of_2(n_experts), KB=triton.next_power_of_2(k),
                                  num_warps=4)
    return weights, ids
