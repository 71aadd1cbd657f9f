"""The gated delta rule in plain torch: a step-by-step form for decode and a chunked form for prompts.

Per value head h (key head h // (Hv/Hk)), with state S [Dk, Dv] and one token (q, k, v, g, beta):

    S <- exp(g) * S                 decay
    S <- S + k (beta * (v - S^T k))^T   delta-rule write: move S^T k towards v
    o  = S^T q                      read with the updated state

Shapes (one sequence, no batch): q, k [T, Hk, Dk]; v [T, Hv, Dv]; g, beta [T, Hv]; state [Hv, Dk, Dv].
Both forms compute in float32, or in float64 when the state is float64, and return (o [T, Hv, Dv] in v's
dtype, final state in the compute dtype). q and k are L2-normalised here when `normalize_qk`, and q is scaled
by `scale` (default Dk^-1/2).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK = 64


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    # eps on the sum of squares, as transformers and fla compute it (llama.cpp clamps the norm instead).
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _prepare(q, k, v, g, beta, state, normalize_qk, scale):
    """Compute dtype, heads expanded to Hv, q/k normalised and q scaled; state zeros if None."""
    n_tokens, n_k_heads, dk = k.shape
    n_v_heads, dv = v.shape[1:]
    if n_v_heads % n_k_heads:
        raise ValueError(f"{n_v_heads} value heads are not a multiple of {n_k_heads} key heads")
    dtype = torch.float64 if state is not None and state.dtype == torch.float64 else torch.float32
    q, k, v, g, beta = (x.to(dtype) for x in (q, k, v, g, beta))
    if normalize_qk:
        q, k = l2_normalize(q), l2_normalize(k)
    q = q * (dk**-0.5 if scale is None else scale)
    ratio = n_v_heads // n_k_heads
    q, k = q.repeat_interleave(ratio, dim=1), k.repeat_interleave(ratio, dim=1)
    if state is None:
        state = torch.zeros(n_v_heads, dk, dv, dtype=dtype, device=v.device)
    return q, k, v, g, beta, state.to(dtype)


def gated_delta_rule_recurrent(q, k, v, g, beta, state=None, normalize_qk=True, scale=None):
    """Token by token, every head at once: the decode form (T is small)."""
    out_dtype = v.dtype
    q, k, v, g, beta, state = _prepare(q, k, v, g, beta, state, normalize_qk, scale)
    out = torch.empty_like(v)
    for t in range(v.shape[0]):
        state = state * g[t].exp()[:, None, None]
        predicted = torch.einsum("hkv,hk->hv", state, k[t])
        delta = beta[t][:, None] * (v[t] - predicted)
        state = state + k[t][:, :, None] * delta[:, None, :]
        out[t] = torch.einsum("hkv,hk->hv", state, q[t])
    return out.to(out_dtype), state


def gated_delta_rule_chunked(q, k, v, g, beta, state=None, normalize_qk=True, scale=None, chunk: int = CHUNK):
    """The same recurrence over chunks of `chunk` tokens: matrix products inside a chunk, a scan across chunks.

    Inside a chunk (positions 1..C, cumulative log decay c_t = g_1 + ... + g_t, start state S0), unrolling the
    recurrence gives S_t = e^{c_t} S0 + sum_{s<=t} e^{c_t-c_s} k_s d_s^T with the writes d_t solving

        d_t + beta_t sum_{s<t} e^{c_t-c_s} (k_t.k_s) d_s = beta_t (v_t - e^{c_t} S0^T k_t),

    a unit lower-triangular system (I + A) D = beta*V - beta*e^c*K S0, so D = U - W S0 with U, W from one
    triangular solve per chunk that does not depend on S0. Then

        O   = e^c * Q S0 + ((Q K^T) o E) D      E[t, s] = e^{c_t-c_s} for s <= t, else 0
        S_C = e^{c_C} S0 + (e^{c_C-c} * K)^T D.
    """
    out_dtype, n_tokens = v.dtype, v.shape[0]
    q, k, v, g, beta, state = _prepare(q, k, v, g, beta, state, normalize_qk, scale)
    pad = -n_tokens % chunk
    # Padding tokens have k = 0, beta = 0 and g = 0: they neither write to nor decay the state.
    q, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))
    g, beta = (F.pad(x, (0, 0, 0, pad)) for x in (g, beta))
    n_chunks = (n_tokens + pad) // chunk
    # [heads, chunks, C, dim] and [heads, chunks, C]
    q, k, v = (x.view(n_chunks, chunk, *x.shape[1:]).permute(2, 0, 1, 3) for x in (q, k, v))
    g, beta = (x.view(n_chunks, chunk, -1).permute(2, 0, 1) for x in (g, beta))

    cum = g.cumsum(-1)
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=v.device).tril()
    # Mask before exp: above the diagonal c_t - c_s > 0 could overflow.
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(~lower, float("-inf")).exp()
    system = (beta[..., :, None] * (k @ k.transpose(-1, -2)) * decay).tril(-1)
    eye = torch.eye(chunk, dtype=v.dtype, device=v.device)
    rhs = torch.cat((beta[..., None] * v, (beta * cum.exp())[..., None] * k), dim=-1)
    solved = torch.linalg.solve_triangular(system + eye, rhs, upper=False, unitriangular=True)
    u, w = solved.split([v.shape[-1], k.shape[-1]], dim=-1)
    scores = (q @ k.transpose(-1, -2)) * decay
    q_decayed = q * cum.exp()[..., None]
    k_to_end = k * (cum[..., -1:] - cum).exp()[..., None]
    chunk_decay = cum[..., -1].exp()[..., None, None]

    out = torch.empty_like(v)
    for i in range(n_chunks):
        writes = u[:, i] - w[:, i] @ state
        out[:, i] = q_decayed[:, i] @ state + scores[:, i] @ writes
        state = chunk_decay[:, i] * state + k_to_end[:, i].transpose(-1, -2) @ writes
    out = out.permute(1, 2, 0, 3).reshape(n_chunks * chunk, -1, v.shape[-1])[:n_tokens]
    return out.to(out_dtype), state


def gated_delta_rule_f64(q, k, v, g, beta, state=None, normalize_qk=True, scale=None):
    """The definition, one head and one token at a time in float64: slow, for tests and device checks only."""
    n_tokens, n_k_heads, dk = k.shape
    n_v_heads, dv = v.shape[1:]
    ratio = n_v_heads // n_k_heads
    q, k, v, g, beta = (x.detach().double().cpu() for x in (q, k, v, g, beta))
    if normalize_qk:
        q = q / (q.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()
        k = k / (k.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()
    scale = dk**-0.5 if scale is None else scale
    states = (torch.zeros(n_v_heads, dk, dv, dtype=torch.float64) if state is None
              else state.detach().double().cpu().clone())
    out = torch.zeros(n_tokens, n_v_heads, dv, dtype=torch.float64)
    for h in range(n_v_heads):
        s = states[h]
        for t in range(n_tokens):
            kt, qt = k[t, h // ratio], q[t, h // ratio] * scale
            s = s * torch.exp(g[t, h])
            s = s + torch.outer(kt, beta[t, h] * (v[t, h] - s.T @ kt))
            out[t, h] = s.T @ qt
        states[h] = s
    return out, states
