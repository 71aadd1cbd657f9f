"""The GatedDeltaNet mixer of Qwen3-Next, on llama.cpp's tensors (attn_qkv, attn_gate, ssm_*).

Per token: project to q/k/v (one causal depthwise conv over their concatenation, then SiLU), to the output gate z,
and to b, a per value head; beta = sigmoid(b), g = A * softplus(a + dt_bias) with A = -exp(A_log) stored as ssm_a.
The gated delta rule (strata.kernels.gdn) turns q/k/v/g/beta into one output per value head, which is
RMS-normed, scaled by ssm_norm, gated by SiLU(z) and projected back by ssm_out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from strata.kernels.gdn import gated_delta_rule
from strata.models.stacked_projections import project_inputs
from strata.models.layers import _fused, rms_norm
from strata.models.weights import QuantWeight, linear


@dataclass(frozen=True)
class GDNShape:
    n_k_heads: int
    n_v_heads: int
    k_dim: int  # per head
    v_dim: int
    conv_kernel: int

    @property
    def conv_channels(self) -> int:
        return 2 * self.n_k_heads * self.k_dim + self.n_v_heads * self.v_dim

    @property
    def conv_state_shape(self) -> tuple[int, int]:
        return (self.conv_kernel - 1, self.conv_channels)

    @property
    def state_shape(self) -> tuple[int, int, int]:
        return (self.n_v_heads, self.k_dim, self.v_dim)

    def qkvz_rows(self) -> tuple[list[int], list[int]]:
        """Rows of a legacy fused ssm_in for attn_qkv (all q, all k, all v) and attn_gate (all z): the file keeps
        transformers' in_proj_qkvz order, grouped per key head as [q (dk), k (dk), v (r dv), z (r dv)]."""
        r, dk, dv = self.n_v_heads // self.n_k_heads, self.k_dim, self.v_dim
        per = 2 * dk + 2 * r * dv
        parts: list[list[int]] = [[], [], [], []]
        for g in range(self.n_k_heads):
            for part, (offset, size) in enumerate(((0, dk), (dk, dk), (2 * dk, r * dv), (2 * dk + r * dv, r * dv))):
                parts[part] += range(g * per + offset, g * per + offset + size)
        return parts[0] + parts[1] + parts[2], parts[3]

    def ba_rows(self) -> tuple[list[int], list[int]]:
        """Rows of ssm_ba for b and a, in value-head order: the file groups them per key head as [b (r), a (r)]."""
        r = self.n_v_heads // self.n_k_heads
        b = [g * 2 * r + j for g in range(self.n_k_heads) for j in range(r)]
        return b, [row + r for row in b]


@dataclass
class GDNWeights:
    norm: torch.Tensor  # attn_norm, the layer's input RMSNorm
    qkv: QuantWeight  # [conv channels, embd]: all q heads, all k heads, all v heads
    gate: QuantWeight  # z: [value heads x v_dim, embd]
    b: QuantWeight  # [value heads, embd], rows of ssm_ba
    a: QuantWeight
    conv: torch.Tensor  # [conv channels, kernel]: tap kernel-1 is the current token
    dt_bias: torch.Tensor  # [value heads]
    decay_rate: torch.Tensor  # ssm_a = -exp(A_log), [value heads], float32
    out_norm: torch.Tensor  # ssm_norm [v_dim]
    out: QuantWeight  # ssm_out [embd, value heads x v_dim]
    # On a GPU: qkv, gate (and b, a where they share the format) in one block tensor, they views of its rows
    # (models/stacked_projections.py), `inputs_parts` of them.
    inputs: QuantWeight | None = None
    inputs_parts: int = 0


def causal_conv(x: torch.Tensor, weight: torch.Tensor, past: torch.Tensor,
                row_states: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv of x [T, C] after `past` [K-1, C] inputs; returns (SiLU(conv) [T, C], new past), or
    with row_states the past after each row, [T, K-1, C]."""
    if row_states:  # a verify window: each row as the one-token step at its position (conv1d's sums vary with T)
        outs, pasts = [], []
        for t in range(x.shape[0]):
            out, past = causal_conv(x[t:t + 1], weight, past)
            outs.append(out)
            pasts.append(past)
        return torch.cat(outs), torch.stack(pasts)
    kernel = weight.shape[1]
    window = torch.cat((past.to(x.dtype), x))
    out = F.conv1d(window.T[None], weight.to(x.dtype)[:, None, :], groups=x.shape[1])[0].T
    return F.silu(out), window[window.shape[0] - (kernel - 1):]


CONV_STEP_MAX_TOKENS = 8  # decode steps: one launch unrolled over the rows; prompt chunks keep torch's conv


def conv_and_gates(mixed: torch.Tensor, conv_weight: torch.Tensor, past: torch.Tensor, b: torch.Tensor,
                   a: torch.Tensor, dt_bias: torch.Tensor, decay_rate: torch.Tensor, row_states: bool = False):
    """(SiLU(causal conv) [T, C], new past, beta = sigmoid(b), g = decay_rate * softplus(a + dt_bias)), beta and g
    float32. A decode step on the GPU takes one launch (kernels/pointwise/gdn_conv_step.py), which writes the new
    past over `past` and returns it; otherwise torch, `past` untouched."""
    if (_fused(mixed) and mixed.shape[0] <= CONV_STEP_MAX_TOKENS and past.is_contiguous()
            and past.device == mixed.device):
        from strata.kernels.pointwise.gdn_conv_step import conv_step_triton

        if not row_states:
            return conv_step_triton(mixed, conv_weight, past, b, a, dt_bias, decay_rate)
        # A verify window: the kernel's sums per row do not depend on the row count (each row its K taps in
        # order), so its rows are the one-token steps'; the past after each row is a copy of the window's inputs,
        # gathered before the kernel writes the last row's over `past`.
        kernel = conv_weight.shape[1]
        window = torch.cat((past, mixed.to(past.dtype)))
        row_pasts = window.unfold(0, kernel - 1, 1)[1:].transpose(1, 2)
        out, _, beta, g = conv_step_triton(mixed, conv_weight, past, b, a, dt_bias, decay_rate)
        return out, row_pasts, beta, g
    mixed, past = causal_conv(mixed, conv_weight, past, row_states)
    beta = torch.sigmoid(b.float())
    return mixed, past, beta, decay_rate * F.softplus(a.float() + dt_bias.float())


def output_gate(out: torch.Tensor, norm_weight: torch.Tensor, z: torch.Tensor, eps: float, dtype: torch.dtype,
                sigmoid: bool = False) -> torch.Tensor:
    """rms_norm(out, norm_weight) * SiLU(z) (or sigmoid(z)) in float32, rounded once to `dtype`."""
    if dtype == out.dtype and _fused(out, norm_weight, z):
        from strata.kernels.pointwise.gdn_out_gate import out_gate_triton

        return out_gate_triton(out, norm_weight, z, eps, sigmoid)
    act = torch.sigmoid if sigmoid else F.silu
    return (rms_norm(out, norm_weight, eps).float() * act(z.float())).to(dtype)


def delta_rule_rows(q, k, v, g, beta, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule one token at a time, as plain decoding runs it, keeping the state after each:
    (outputs [T, ...], states [T, heads, k_dim, v_dim]) for a verify window to roll back to any row."""
    outs, states = [], []
    for t in range(q.shape[0]):
        o, state = gated_delta_rule(q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1], beta[t:t + 1], state)
        outs.append(o)
        states.append(state)
    return torch.cat(outs), torch.stack(states)


def gated_deltanet(w: GDNWeights, shape: GDNShape, h: torch.Tensor, conv_state: torch.Tensor,
                   state: torch.Tensor, eps: float,
                   row_states: bool = False,
                   x: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One GatedDeltaNet layer over h [T, embd] -> (mixer output [T, embd], new conv state, new recurrent state).
    With row_states (a verify window) the states come per row, [T, ...]: the window keeps them to roll back.
    `x`: h already through the layer's input norm."""
    s, n_tokens = shape, h.shape[0]
    x = rms_norm(h, w.norm, eps) if x is None else x
    qkv, z, b, a = project_inputs(x, w.inputs, w.inputs_parts, (w.qkv, w.gate, w.b, w.a))
    mixed, conv_state, beta, g = conv_and_gates(qkv, w.conv, conv_state, b, a, w.dt_bias, w.decay_rate, row_states)
    key_dim = s.n_k_heads * s.k_dim
    q, k, v = mixed.split([key_dim, key_dim, s.n_v_heads * s.v_dim], dim=-1)
    q, k = q.reshape(n_tokens, s.n_k_heads, s.k_dim), k.reshape(n_tokens, s.n_k_heads, s.k_dim)
    v = v.reshape(n_tokens, s.n_v_heads, s.v_dim)
    out, state = (delta_rule_rows if row_states else gated_delta_rule)(q, k, v, g, beta, state)
    z = z.view(n_tokens, s.n_v_heads, s.v_dim)
    out = output_gate(out, w.out_norm, z, eps, h.dtype)
    return linear(out.reshape(n_tokens, -1), w.out), conv_state, state
