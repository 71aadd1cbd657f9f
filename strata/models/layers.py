"""The building blocks every decoder here shares: RMSNorm, neox RoPE, GQA attention, SwiGLU, routed experts."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from strata.models.weights import QuantWeight, linear, row_by_row


# tools/count_step_kernels.py --fused: CPU tensors take the kernels too (Triton's interpreter), to count launches.
FUSED_ON_CPU = False


def _kernels_take(t: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether the one-launch kernels (kernels/pointwise) take work on t's device in dtype: on CUDA, below float32
    (the exact mode stays torch's)."""
    return (t.is_cuda or FUSED_ON_CPU) and dtype in (torch.bfloat16, torch.float16)


def _fused(x: torch.Tensor, *others: torch.Tensor) -> bool:
    """`_kernels_take` x in its dtype, every operand in that dtype."""
    return _kernels_take(x, x.dtype) and all(t.dtype == x.dtype for t in others)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, quantize: bool = False) -> torch.Tensor:
    """`quantize` (STRATA_DP4A: a dp4a matvec reads the norm next): the kernel also writes the normed rows' int8
    codes, attached to them (models/dp4a_step.py)."""
    if _fused(x, weight):
        from strata.kernels.pointwise.rms_norm import rms_norm_triton
        from strata.models import dp4a_step

        rounded = dp4a_step.rounded_buffers(x) if quantize else None
        return dp4a_step.attach(rms_norm_triton(x, weight, eps, rounded), rounded)
    # Normalise in float32 whatever the activation dtype, as the reference implementations do.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def add_rms_norm(h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                 eps: float, quantize: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add and the norm of the next block: (h + delta, rms_norm(h + delta)). `quantize` (STRATA_DP4A:
    a dp4a matvec reads the norm next): the kernel also writes the normed rows' int8 codes, attached to them
    (models/dp4a_step.py)."""
    if _fused(h, delta, weight):
        from strata.kernels.pointwise.add_rms_norm import add_rms_norm_triton
        from strata.models import dp4a_step

        rounded = dp4a_step.rounded_buffers(h) if quantize else None
        residual, out = add_rms_norm_triton(h, delta, weight, eps, rounded)
        return residual, dp4a_step.attach(out, rounded)
    h = h + delta
    return h, rms_norm(h, weight, eps)


def add_norm_route(h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, router: QuantWeight, eps: float,
                   k: int, normalize: bool, quantize: bool = False):
    """An MoE layer's residual add + norm, router and top-k in one launch (kernels/pointwise/add_norm_route.py):
    (h + delta, its norm, weights [T, k] float32, int32 ids [T, k]); None where it does not apply (the caller
    runs `add_rms_norm`, the router and `route_topk`): not a fused dtype, a quantized router, a prompt chunk, or
    STRATA_ROUTE_SEPARATE. `quantize`: the normed rows' int8 codes too, as `add_rms_norm`'s."""
    from strata import switches
    from strata.models.weights import FLOAT_VIEWS

    if not (_fused(h, delta, weight) and router.ggml_type in FLOAT_VIEWS and h.dim() == 2
            and h.shape[0] <= ROUTE_KERNEL_MAX_TOKENS) or switches.get("STRATA_ROUTE_SEPARATE"):
        return None
    from strata.kernels.pointwise.add_norm_route import add_norm_route_triton

    from strata.kernels.pdl import weights_settled

    fresh = not router.kept_as(h.dtype)  # converted by this call (STRATA_PDL reads the rows before the wait)
    rows = router.dequantize(h.dtype)
    from strata.models import dp4a_step

    rounded = dp4a_step.rounded_buffers(h) if quantize else None
    routed = add_norm_route_triton(h, delta, weight, rows, eps, k, normalize, router_kept=weights_settled(rows, fresh),
                                   rounded=rounded)
    return routed if routed is None else (routed[0], dp4a_step.attach(routed[1], rounded), *routed[2:])


def shared_gate_add_rms_norm(h: torch.Tensor, routed: torch.Tensor, shared: torch.Tensor, x: torch.Tensor,
                             gate_weight: torch.Tensor, norm_weight: torch.Tensor,
                             eps: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`add_rms_norm(h, add_gated_shared(routed, shared, x, gate_weight), norm_weight, eps)` in one launch, the same
    bytes (kernels/pointwise/shared_gate_add_norm.py); None where the kernel does not apply (the caller runs the two)."""
    if not (_fused(h, routed, shared, x, gate_weight, norm_weight) and h.dim() == 2):
        return None
    from strata.kernels.pointwise.shared_gate_add_norm import shared_gate_add_norm_triton

    return shared_gate_add_norm_triton(h, routed, shared, x, gate_weight, norm_weight, eps)


def add_gated_shared(routed: torch.Tensor, shared: torch.Tensor, x: torch.Tensor,
                     gate_weight: torch.Tensor) -> torch.Tensor:
    """routed + shared * sigmoid(x @ gate_weight): the sigmoid-gated shared expert joining the routed experts' sum."""
    if _fused(x, routed, shared, gate_weight) and x.dim() == 2:
        from strata.kernels.pointwise.shared_gate import shared_gate_triton

        return shared_gate_triton(routed, shared, x, gate_weight)
    if row_by_row(x):  # a verify window: each row's dot as plain decode's step takes it
        gate = torch.cat([x[r:r + 1] @ gate_weight for r in range(x.shape[0])])
    else:
        gate = x @ gate_weight
    return routed + shared * torch.sigmoid(gate)[:, None]


def embed_rows(embed, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The rows of a token embedding (a QuantWeight) that `ids` name, dequantized to dtype: one launch where the
    kernel reads the format (kernels/pointwise/embed_rows.py: the same bytes), else a gather and torch's ops."""
    if _kernels_take(ids, dtype) and embed.raw.device == ids.device:
        from strata.kernels.pointwise.embed_rows import embed_rows_triton

        rows = embed_rows_triton(embed.raw, embed.ggml_type, embed.shape[-1], ids, dtype)
        if rows is not None:
            return rows
    return embed[ids].dequantize(dtype)


class Rope:
    """Neox-style rotary embedding: the two halves of each head rotate together."""

    def __init__(self, head_dim: int, theta: float, device: torch.device):
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if _kernels_take(positions, dtype):
            from strata.kernels.pointwise.rope_cos_sin import rope_cos_sin_triton

            return rope_cos_sin_triton(positions, self.inv_freq, dtype)  # one launch, not seven
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: [T, heads, head_dim]; cos/sin: [T, head_dim]."""
        if _fused(x, cos, sin):
            from strata.kernels.pointwise.rope import rope_triton

            return rope_triton(x, cos, sin)
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos[:, None, :] + rotated * sin[:, None, :]

    @staticmethod
    def apply_partial(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_rot: int) -> torch.Tensor:
        """Rotate only the first n_rot dims of each head (cos/sin: [T, n_rot]); the rest pass through."""
        if _fused(x, cos, sin):
            from strata.kernels.pointwise.rope import rope_triton

            return rope_triton(x, cos, sin, n_rot)
        return torch.cat((Rope.apply(x[..., :n_rot], cos, sin), x[..., n_rot:]), dim=-1)


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float,
                 cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head RMSNorm of the queries and keys [T, heads, D], then RoPE on their first cos.shape[-1] dims."""
    if _fused(q, k, q_weight, k_weight, cos, sin):
        from strata.kernels.pointwise.qk_norm_rope import qk_norm_rope_triton

        return qk_norm_rope_triton(q, k, q_weight, k_weight, eps, cos, sin)
    q, k = rms_norm(q, q_weight, eps), rms_norm(k, k_weight, eps)
    n_rot = cos.shape[-1]
    if n_rot == q.shape[-1]:
        return Rope.apply(q, cos, sin), Rope.apply(k, cos, sin)
    return Rope.apply_partial(q, cos, sin, n_rot), Rope.apply_partial(k, cos, sin, n_rot)


@dataclass(frozen=True)
class QKNorm:
    """What an attention layer's q/k norm + RoPE needs, handed to the KV backend (`attend_normed`) so that a
    backend storing the turned keys itself may do both in one launch."""

    q_weight: torch.Tensor
    k_weight: torch.Tensor
    eps: float
    cos: torch.Tensor
    sin: torch.Tensor

    def apply(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return qk_norm_rope(q, k, self.q_weight, self.k_weight, self.eps, self.cos, self.sin)

    def fused(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
        """Whether the one-launch kernels take these operands (as `qk_norm_rope` would)."""
        return _fused(q, k, v, self.q_weight, self.k_weight, self.cos, self.sin)


def swiglu(x: torch.Tensor, gate: QuantWeight, up: QuantWeight, down: QuantWeight) -> torch.Tensor:
    return linear(F.silu(linear(x, gate)) * linear(x, up), down)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """Causal GQA attention of T new queries at positions start.. over S = start + T keys.

    q: [T, H, D]; k, v: [S, Hkv, D]; returns [T, H, D].
    """
    n_tokens, n_keys = q.shape[0], k.shape[0]
    allowed = torch.arange(n_keys, device=q.device)[None, :] <= (start + torch.arange(n_tokens, device=q.device))[:, None]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=allowed, enable_gqa=True
    )
    return out.transpose(0, 1)


ROUTE_KERNEL_MAX_TOKENS = 64  # decode steps and verify windows; a prompt chunk keeps torch's top-k (one program a row)


def route_topk(router_logits: torch.Tensor, k: int, normalize: bool,
               kernel_ids: torch.dtype = torch.int64) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax routing: (weights [T, k] float32, expert ids [T, k]: int64, or `kernel_ids` where the kernel runs,
    int32 sparing the expert kernels a conversion launch)."""
    if _fused(router_logits) and router_logits.shape[0] <= ROUTE_KERNEL_MAX_TOKENS:
        from strata.kernels.pointwise.route_topk import route_topk_triton

        return route_topk_triton(router_logits, k, normalize, kernel_ids)
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids
