"""An MoE layer's residual add + RMSNorm, its router and the softmax top-k in one launch: what
`add_rms_norm_triton`, the router's `F.linear` (a cuBLAS GEMM of one row on the GPU) and `route_topk_triton` compute,
three launches in every MoE layer of a decode step.

Programs split the experts (EB router rows each); each computes the add and the norm of its token's row as
add_rms_norm_triton does (program 0 stores them: the residual is that kernel's bytes, the normed row too unless the
norm's sum runs in another order, by its warps or the compiler's choice: a step of the dtype at most), its experts'
logits (fp32 sums of bf16 products, rounded to the activation dtype as F.linear's output is), and counts
itself on a per-token counter; the last to arrive reads every logit back and runs route_topk's softmax top-k on them
(a fixed sequence: the same bytes whichever program is last), then resets the counter for the next launch. The
router rows are read in the activation dtype (the model's converted copy). The logits' sums run in another order
than cuBLAS's: within an fp32 rounding of each other before the rounding to the activation dtype, so a logit may
sit one step of that dtype away and an expert at a near-tie may change (bound: tests/kernels/pointwise/
test_add_norm_route.py; greedy tokens: tools/device/attn_tokens_check.py --only route).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from strata.kernels.attention.decode_short import arrival_counters
from strata.kernels.pdl import launch_options, pdl_start, pdl_wait
from strata.kernels.pointwise.add_rms_norm import rounded_options, store_rounded_row
from strata.kernels.pointwise.route_topk import softmax_topk


@dataclass(frozen=True)
class RouteConfig:
    """Tunables (`strata bench decode-attn --sweep` times the alternatives)."""

    experts_per_program: int = 1  # 128 experts: 128 programs, 4 KB of bf16 router rows each
    # 0: one warp a 2,048 values (at 4,096 one warp spills): a program's sums and the top-k then reduce within one
    # warp, without barriers (63 -> 2 in the sm_90 build). Session 17, the A3B step: 1.82 ms with add_rms_norm_triton's
    # 8 warps (4 experts a program), 1.80 at 4, 1.77 at one (and 1 expert a program); its normed bytes may then differ
    # from that kernel's by a step of the dtype.
    warps: int = 0


DEFAULT = RouteConfig()


def launch_warps(block: int, config: RouteConfig = DEFAULT) -> int:
    """The launch's warps for rows of `block` (a power of two) values: the config's, else one a 2,048, at most 4."""
    return config.warps or min(4, max(1, block // 2048))


@triton.jit
def _add_norm_route_kernel(h_ptr, d_ptr, nw_ptr, router_ptr, res_ptr, out_ptr, logits_ptr, count_ptr, weights_ptr,
                           ids_ptr, n_cols, n_experts, eps, BLOCK: tl.constexpr, EB: tl.constexpr,
                           PROGRAMS: tl.constexpr, K: tl.constexpr, NORMALIZE: tl.constexpr, EBLOCK: tl.constexpr,
                           KB: tl.constexpr, PDL: tl.constexpr = 0, codes_ptr=None, scales_ptr=None, sums_ptr=None,
                           QUANT: tl.constexpr = 0):
    pdl_start(PDL)
    add_norm_route_item(tl.program_id(0), tl.program_id(1).to(tl.int64), h_ptr, d_ptr, nw_ptr, router_ptr, res_ptr,
                        out_ptr, logits_ptr, count_ptr, weights_ptr, ids_ptr, n_cols, n_experts, eps, BLOCK, EB,
                        PROGRAMS, K, NORMALIZE, EBLOCK, KB, PDL, codes_ptr, scales_ptr, sums_ptr, QUANT)


@triton.jit
def add_norm_route_item(p, row, h_ptr, d_ptr, nw_ptr, router_ptr, res_ptr, out_ptr, logits_ptr, count_ptr,
                        weights_ptr, ids_ptr, n_cols, n_experts, eps, BLOCK: tl.constexpr, EB: tl.constexpr,
                        PROGRAMS: tl.constexpr, K: tl.constexpr, NORMALIZE: tl.constexpr, EBLOCK: tl.constexpr,
                        KB: tl.constexpr, PDL: tl.constexpr, codes_ptr=None, scales_ptr=None, sums_ptr=None,
                        QUANT: tl.constexpr = 0):
    """Program p of token `row` (`_add_norm_route_kernel`'s body; also an item of the chained MoE launch,
    kernels/moe/chain_moe.py): whether it was its token's last, the one that wrote the routing. QUANT
    (STRATA_DP4A): program 0 also writes the normed row's int8 codes, scales and sums (`store_rounded_row`)."""
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    dtype = out_ptr.dtype.element_ty
    e = p * EB + tl.arange(0, EB)
    w_router = tl.load(router_ptr + e[:, None].to(tl.int64) * n_cols + cols[None, :],
                       mask=(e[:, None] < n_experts) & mask[None, :], other=0.0).to(tl.float32)
    pdl_wait(PDL)  # the router's rows above: no kernel of the step writes them (kernels/pdl.py); all else after
    # As _add_rms_norm_kernel: the residual rounded once, the norm rounded before the weight multiplies and after.
    h = tl.load(h_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    d = tl.load(d_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    s = (h + d).to(dtype)
    x = s.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    normed = (x * inv).to(dtype).to(tl.float32)
    w = tl.load(nw_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = (w * normed).to(dtype)
    if p == 0:
        tl.store(res_ptr + row * n_cols + cols, s, mask=mask)
        tl.store(out_ptr + row * n_cols + cols, y, mask=mask)
        if QUANT:
            store_rounded_row(y, row, codes_ptr, scales_ptr, sums_ptr, n_cols, BLOCK)
    logit = tl.sum(w_router * y.to(tl.float32)[None, :], axis=1).to(dtype).to(tl.float32)
    tl.store(logits_ptr + row * n_experts + e, logit, mask=e < n_experts)
    tl.debug_barrier()  # every thread's logits are written before the program counts itself (release)
    counter = count_ptr + row
    last = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == PROGRAMS - 1
    if last:
        every = tl.arange(0, EBLOCK)
        live = every < n_experts
        logits = tl.load(logits_ptr + row * n_experts + every, mask=live, other=float("-inf"), cache_modifier=".cg")
        chosen_p, chosen_id, slots = softmax_topk(logits, every, live, K, NORMALIZE, EBLOCK, KB)
        tl.store(weights_ptr + row * K + slots, chosen_p, mask=slots < K)
        tl.store(ids_ptr + row * K + slots, chosen_id.to(ids_ptr.dtype.element_ty), mask=slots < K)
        tl.store(counter, 0)  # ready for the next launch
    return last


def add_norm_route_triton(h: torch.Tensor, delta: torch.Tensor, norm_weight: torch.Tensor, router: torch.Tensor,
                          eps: float, k: int, normalize: bool, ids_dtype: torch.dtype = torch.int32,
                          config: RouteConfig = DEFAULT, router_kept: bool = True, rounded=None):
    """h, delta [T, D] (bf16/fp16), norm_weight [D] and router [E, D] of that dtype -> (h + delta, its RMSNorm x,
    routing weights [T, k] float32, expert ids [T, k] of ids_dtype), or None when the launch cannot count its
    programs (too many rows, or the counters not yet made while capturing): the caller runs the three kernels.
    `router_kept`: no kernel of this step made the router (else, a conversion just queued, the launch takes no PDL:
    its programs read the rows before their wait). `rounded`: the normed rows' quantize32 codes, scales and sums go
    there too (add_rms_norm_triton's argument)."""
    n_tokens, n_cols = h.shape
    n_experts = router.shape[0]
    if not 1 <= k <= n_experts or router.shape[1] != n_cols:
        raise ValueError(f"top-{k} of a router {tuple(router.shape)} over rows of {n_cols}")
    counters = arrival_counters(h.device, n_tokens)
    if counters is None:
        return None
    rows, deltas = h.contiguous(), delta.contiguous()
    residual, out = torch.empty_like(rows), torch.empty_like(rows)
    logits = torch.empty(n_tokens, n_experts, dtype=torch.float32, device=h.device)
    weights = torch.empty(n_tokens, k, dtype=torch.float32, device=h.device)
    ids = torch.empty(n_tokens, k, dtype=ids_dtype, device=h.device)
    if n_tokens:
        block = triton.next_power_of_2(n_cols)
        eb = min(triton.next_power_of_2(config.experts_per_program), triton.next_power_of_2(n_experts))
        programs = triton.cdiv(n_experts, eb)
        _add_norm_route_kernel[(programs, n_tokens)](
            rows, deltas, norm_weight.contiguous(), router.contiguous(), residual, out, logits, counters, weights,
            ids, n_cols, n_experts, eps, BLOCK=block, EB=eb, PROGRAMS=programs, K=k, NORMALIZE=normalize,
            EBLOCK=triton.next_power_of_2(n_experts), KB=triton.next_power_of_2(k),
            num_warps=launch_warps(block, config), **(launch_options(h) if router_kept else {}),
            **rounded_options(rounded))
    return residual, out, weights, ids
