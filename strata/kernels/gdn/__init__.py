"""Gated delta rule (the GatedDeltaNet recurrence): torch references, and fla-core's Triton kernels on CUDA.

`gated_delta_rule` is the one entry point the models call; see `reference.py` for the math and the shapes.
"""

from __future__ import annotations

import functools

import torch

from strata.kernels.gdn.reference import (
    CHUNK,
    gated_delta_rule_chunked,
    gated_delta_rule_f64,
    gated_delta_rule_recurrent,
    l2_normalize,
)

# Below this many tokens the step-by-step form beats a chunk padded to 64.
RECURRENT_MAX_TOKENS = 16


@functools.cache
def fla_kernels():
    """fla-core's (chunk, fused_recurrent) gated delta rule, or None where it is not installed."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    except ImportError:
        return None
    return chunk_gated_delta_rule, fused_recurrent_gated_delta_rule


def gated_delta_rule_fla(q, k, v, g, beta, state=None, normalize_qk=True, scale=None, recurrent=None):
    """fla-core on CUDA, same contract as the references (one sequence, state [Hv, Dk, Dv] float32).

    fla's two entry points differ in their positional order: fused_recurrent takes (q, k, v, g, gk, gv, beta),
    chunk takes (q, k, v, g, beta). Everything past v is passed by keyword. `recurrent` picks the kernel
    (default: fused_recurrent for a few tokens, chunk otherwise).
    """
    chunk_fn, recurrent_fn = fla_kernels()
    if recurrent is None:
        recurrent = v.shape[0] <= RECURRENT_MAX_TOKENS
    fn = recurrent_fn if recurrent else chunk_fn
    initial = None if state is None else state.float()[None].contiguous()
    out, final = fn(
        q[None].contiguous(), k[None].contiguous(), v[None].contiguous(),
        g=g[None].float().contiguous(), beta=beta[None].float().contiguous(), scale=scale,
        initial_state=initial, output_final_state=True, use_qk_l2norm_in_kernel=normalize_qk,
    )
    return out[0], final[0]


def gated_delta_rule(q, k, v, g, beta, state=None, normalize_qk=True, scale=None):
    """(o [T, Hv, Dv], final state [Hv, Dk, Dv]): fla on CUDA when importable, else the torch references.
    float32 activations keep the references: fla's float32 dots run in TF32 (relative error ~3e-3 on a whole
    model), and float32 is the engine's exact mode."""
    if v.is_cuda and v.dtype != torch.float32 and fla_kernels() is not None:
        return gated_delta_rule_fla(q, k, v, g, beta, state, normalize_qk, scale)
    form = gated_delta_rule_recurrent if v.shape[0] <= RECURRENT_MAX_TOKENS else gated_delta_rule_chunked
    return form(q, k, v, g, beta, state, normalize_qk, scale)


__all__ = [
    "CHUNK",
    "RECURRENT_MAX_TOKENS",
    "fla_kernels",
    "gated_delta_rule",
    "gated_delta_rule_chunked",
    "gated_delta_rule_f64",
    "gated_delta_rule_fla",
    "gated_delta_rule_recurrent",
    "l2_normalize",
]
