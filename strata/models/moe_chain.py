"""The decoder's side of STRATA_DECODE_CHAIN: an MoE layer's add + norm + routing, its resident experts and (where
the layer ends plainly) the residual add + next norm as one launch (kernels/moe/chain_moe.py) where it applies,
else None and the layer runs its usual launches."""

from __future__ import annotations

import torch

from strata import switches


def chained_moe_layer(model, i: int, h: torch.Tensor, delta: torch.Tensor):
    """The end of MoE layer i of `model` (a DecoderLM) from its residual h and mixer output delta: (the new residual,
    its norm by `norm_after(i)`), as `DecoderLM.layer` gives them; None unless the switch is on, the layer's experts
    are all resident and read by the decode kernels, and the add + route launch itself would apply
    (`add_norm_route`: a fused dtype, a float router, a decode-sized step). Without a shared expert and with the
    decoder's own `join_add_norm`, the last add + norm is the launch's last phase; else the model joins after it."""
    text = str(switches.get("STRATA_DECODE_CHAIN")).strip()
    if text in ("", "0"):
        return None
    from strata.engine import experts as backends
    from strata.kernels.moe.chain_moe import chain_moe_triton, parse_config
    from strata.kernels.moe.gemv import DecodeExperts
    from strata.models.decoder import DecoderLM
    from strata.models.layers import ROUTE_KERNEL_MAX_TOKENS, _fused
    from strata.models.weights import FLOAT_VIEWS

    w, c, resident = model.ffn[i], model.config, model.experts
    if not (isinstance(resident, backends.ResidentExperts) and i in resident.stacks and h.dim() == 2
            and 1 <= h.shape[0] <= ROUTE_KERNEL_MAX_TOKENS and _fused(h, delta, w.norm)
            and w.router.ggml_type in FLOAT_VIEWS) or switches.get("STRATA_ROUTE_SEPARATE"):
        return None
    stack = resident.stacks[i]
    if backends.kernel_path(stack, h) != "decode":
        return None
    next_norm = model.norm_after(i)
    join = (w.shared_gate is None and type(model).join_add_norm is DecoderLM.join_add_norm
            and _fused(h, next_norm))
    # (A router converted by this call needs no care: the chained launch reads it after its PDL wait.)
    out = chain_moe_triton(h, delta, w.norm, w.router.dequantize(h.dtype), c.rms_eps, c.n_experts_used,
                           c.norm_topk_prob, DecodeExperts.of_stack(stack), site=i, config=parse_config(text),
                           next_norm=next_norm if join else None)
    if out is None:
        return None
    if join:
        return out[3], out[4]
    h, x, routed = out
    return model.join_add_norm(i, h, routed, model.shared_swiglu(i, x, w), x)
