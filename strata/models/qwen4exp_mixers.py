"""qwen4exp's two token mixers, each taking the hyper-connection read `x` [T, embd] (already normalised).

QSA attention (Strata's src/core/layer.cpp `qsa_layer`, include/strata/kernels/qsa.hpp):
    attn_q gives per head [query (D), output gate (D)]; q and k are RMS-normed per head, RoPE (NEOX) turns their
    first n_rot dims; v is used as is; query head h reads KV head h // (H / Hkv); out = attn * sigmoid(gate).
    The indexer keeps every cell's raw key (indexer.k_proj @ x); its queries (indexer.q_proj, RMS-normed per head,
    RoPE at the token's position) score pooled 4-cell keys: score = sum_h relu(q_h . key). Each query keeps the
    top_k + 3 best cells (kernels/select); when the context holds no more than that, the selection is every cell
    and the attention is called without one (dense causal).

Gated DeltaNet (layer.cpp `gdn_layer`, include/strata/kernels/gdn.hpp):
    qkv = attn_qkv @ x -> causal depthwise conv + SiLU over all channels -> q, k (Hk heads), v (Hv heads);
    value head h reads q/k head h % Hk (modulo: the file's v-head order); beta = sigmoid(ssm_beta @ x);
    g = softplus(ssm_alpha @ x + dt_bias) * ssm_a; the gated delta rule (strata.kernels.gdn);
    y = rmsnorm(o) * ssm_norm * sigmoid(attn_gate @ x)  (sigmoid, where Qwen3-Next has SiLU); out = ssm_out @ y.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from strata.engine.kv import attend_as_steps
from strata.kernels.gdn import gated_delta_rule
from strata.kernels.select.keys import rope_neox
from strata.kernels.select.scores import block_scores
from strata.kernels.select.topk import select_cells
from strata.models.gated_deltanet import GDNShape, conv_and_gates, delta_rule_rows, output_gate
from strata.models.stacked_projections import project_inputs
from strata.models.layers import Rope, rms_norm
from strata.models.weights import QuantWeight, linear


@dataclass(frozen=True)
class QSAShape:
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_rot: int
    rope_base: float
    indexer_heads: int
    indexer_dim: int
    top_k: int

    @property
    def selection_cells(self) -> int:
        """Cells a query keeps: the top_k best plus the tail block's up to 3 (qsa.hpp `qsa_index`)."""
        return self.top_k + 3


@dataclass
class QSAWeights:
    q: QuantWeight  # [heads x 2 head_dim, embd]: per head, the query then its output gate
    k: QuantWeight
    v: QuantWeight
    o: QuantWeight
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    # The indexer; None in the MTP block, whose attention is always dense.
    indexer_q: QuantWeight | None = None  # [indexer heads x indexer dim, embd]
    indexer_k: QuantWeight | None = None  # [indexer dim, embd]
    indexer_q_norm: torch.Tensor | None = None
    indexer_k_norm: torch.Tensor | None = None


@dataclass
class Qwen4ExpGDNWeights:
    qkv: QuantWeight  # [conv channels, embd]: all q heads, all k heads, all v heads
    gate: QuantWeight  # z [value heads x v_dim, embd]
    alpha: QuantWeight  # [value heads, embd]
    beta: QuantWeight
    conv: torch.Tensor  # [conv channels, kernel]: tap kernel-1 is the current token
    dt_bias: torch.Tensor
    decay_rate: torch.Tensor  # ssm_a, used as stored, float32
    out_norm: torch.Tensor  # [v_dim]
    out: QuantWeight  # [embd, value heads x v_dim]
    # On a GPU: qkv, gate (and beta, alpha where they share the format) in one block tensor, they views of its rows
    # (models/stacked_projections.py), `inputs_parts` of them.
    inputs: QuantWeight | None = None
    inputs_parts: int = 0


def qsa_selection(w: QSAWeights, s: QSAShape, x: torch.Tensor, start: int, positions: torch.Tensor, keys,
                  eps: float):
    """Store the raw indexer keys of cells start.. in `keys` (an engine.qwen4exp_cache.IndexerKeys); then
    (ids, width) of the cells each query keeps, or None when every query keeps all of its cells."""
    keys.append(start, linear(x, w.indexer_k), w.indexer_k_norm)
    if start + x.shape[0] <= s.selection_cells:
        return None
    return indexer_select(w, s, x, positions, keys.keys(), keys.dead, eps)


def indexer_select(w: QSAWeights, s: QSAShape, x: torch.Tensor, positions: torch.Tensor, pooled: torch.Tensor,
                   dead: torch.Tensor, eps: float):
    """(ids, width) of the cells kept by the queries of x at `positions`, scoring the pooled keys `pooled`
    [blocks, Dk] (those past a query's completed blocks count for nothing) and the tail's `dead` key."""
    q_idx = rms_norm(linear(x, w.indexer_q).float().view(x.shape[0], s.indexer_heads, s.indexer_dim),
                     w.indexer_q_norm.float(), eps)
    q_idx = rope_neox(q_idx, positions[:, None], s.n_rot, s.rope_base)
    n_kv = positions + 1
    return select_cells(block_scores(q_idx, pooled, dead, n_kv), n_kv, s.top_k)


def qsa_attention(w: QSAWeights, s: QSAShape, x: torch.Tensor, kv, layer: int, start: int, cos: torch.Tensor,
                  sin: torch.Tensor, selection, eps: float, rows_as_steps: bool = False) -> torch.Tensor:
    """One QSA layer over x [T, embd]; `kv.attend` stores the keys/values and attends (over `selection` if any);
    `rows_as_steps` (a verify window): row by row, as plain decoding's steps (kv.attend_as_steps)."""
    q, k, v, gate = qsa_project(w, s, x, cos, sin, eps)
    if rows_as_steps:
        out = attend_as_steps(kv, layer, q, k, v, start, selection)
    elif selection is None:
        out = kv.attend(layer, q, k, v, start)
    else:
        out = kv.attend(layer, q, k, v, start, selection=selection)
    return qsa_output(w, s, out, gate)


def qsa_project(w: QSAWeights, s: QSAShape, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """QSA's inputs to the attention: (q, k normed and turned, v, the output gate), per head."""
    n_tokens, d = x.shape[0], s.head_dim
    q, gate = linear(x, w.q).view(n_tokens, s.n_heads, 2 * d).split(d, dim=-1)
    q = rms_norm(q, w.q_norm, eps)
    k = rms_norm(linear(x, w.k).view(n_tokens, s.n_kv_heads, d), w.k_norm, eps)
    v = linear(x, w.v).view(n_tokens, s.n_kv_heads, d)
    q, k = Rope.apply_partial(q, cos, sin, s.n_rot), Rope.apply_partial(k, cos, sin, s.n_rot)
    return q, k, v, gate


def qsa_output(w: QSAWeights, s: QSAShape, out: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """The attention's output [T, heads, D] gated and projected back: [T, embd]."""
    out = out * torch.sigmoid(gate)
    return linear(out.reshape(out.shape[0], s.n_heads * s.head_dim), w.o)


def qwen4exp_gdn(w: Qwen4ExpGDNWeights, s: GDNShape, x: torch.Tensor, conv_state: torch.Tensor,
                 state: torch.Tensor, eps: float,
                 row_states: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One Gated DeltaNet layer over x [T, embd] -> (output [T, embd], new conv state, new recurrent state);
    with row_states (a verify window) the states after each row, [T, ...]."""
    n_tokens = x.shape[0]
    qkv, z, b, a = project_inputs(x, w.inputs, w.inputs_parts, (w.qkv, w.gate, w.beta, w.alpha))
    mixed, conv_state, beta, g = conv_and_gates(qkv, w.conv, conv_state, b, a, w.dt_bias, w.decay_rate, row_states)
    key_dim = s.n_k_heads * s.k_dim
    q, k, v = mixed.split([key_dim, key_dim, s.n_v_heads * s.v_dim], dim=-1)
    # Value head h reads q/k head h % Hk: tile the key heads up to Hv so the kernel pairs them one to one.
    tile = s.n_v_heads // s.n_k_heads
    q = q.reshape(n_tokens, s.n_k_heads, s.k_dim).repeat(1, tile, 1)
    k = k.reshape(n_tokens, s.n_k_heads, s.k_dim).repeat(1, tile, 1)
    rule = delta_rule_rows if row_states else gated_delta_rule
    out, state = rule(q, k, v.reshape(n_tokens, s.n_v_heads, s.v_dim), g, beta, state)
    z = z.view(n_tokens, s.n_v_heads, s.v_dim)
    out = output_gate(out, w.out_norm, z, eps, x.dtype, sigmoid=True)
    return linear(out.reshape(n_tokens, -1), w.out), conv_state, state
