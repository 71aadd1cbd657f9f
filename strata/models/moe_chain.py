"""The decoder's side of STRATA_DECODE_CHAIN: an MoE layer's o projection (where its attention is the decoder's
own), add + norm + routing, resident experts and (where the layer ends plainly) the residual add + next norm as one
launch (kernels/moe/chain_moe.py), and an attention layer's stacked q/k/v projection with its norm + RoPE + store
(kernels/pointwise/chain_qkv_store.py, in the captured step's KV views), where they apply; else the layer runs its
usual launches."""

from __future__ import annotations

import torch

from strata import switches


def _switch() -> str | None:
    """STRATA_DECODE_CHAIN's text where it is on ("1" or a tile config), else None."""
    text = str(switches.get("STRATA_DECODE_CHAIN")).strip()
    return None if text in ("", "0") else text


def chain_config(model, i: int, h: torch.Tensor):
    """STRATA_DECODE_CHAIN's ChainConfig where the chain may take MoE layer i of `model` (a DecoderLM) for the rows
    h, else None: the switch on, the layer's experts all resident and read by the decode kernels, and the add +
    route launch itself would apply (`add_norm_route`: a fused dtype, a float router, a decode-sized step)."""
    text = _switch()
    if text is None:
        return None
    from strata.engine import experts as backends
    from strata.kernels.moe.chain_moe import parse_config
    from strata.models.layers import ROUTE_KERNEL_MAX_TOKENS, _fused
    from strata.models.weights import FLOAT_VIEWS

    w, resident = model.ffn[i], model.experts
    if not (w.router is not None and isinstance(resident, backends.ResidentExperts) and i in resident.stacks
            and h.dim() == 2 and 1 <= h.shape[0] <= ROUTE_KERNEL_MAX_TOKENS and _fused(h, w.norm)
            and w.router.ggml_type in FLOAT_VIEWS) or switches.get("STRATA_ROUTE_SEPARATE"):
        return None
    if backends.kernel_path(resident.stacks[i], h) != "decode":
        return None
    return parse_config(text)


def folds_o(model, i: int, h: torch.Tensor) -> bool:
    """Whether the o projection can be the launch's first phase: the decoder's own attention, whose `linear` over
    the heads would take the quantized matvec (kernels/quant/matvec.py: the same program as that phase)."""
    from strata.kernels.moe.decode import SPECS
    from strata.kernels.moe.stack import dot_length_fits
    from strata.kernels.quant.matvec import MAX_ROWS
    from strata.models import layers
    from strata.models.decoder import DecoderLM
    from strata.models.weights import FLOAT_VIEWS
    from strata.quant import get_format

    if type(model).mixer is not DecoderLM.mixer or type(model)._attention is not DecoderLM._attention:
        return False
    o = model.attention[i].o
    name = get_format(o.ggml_type).name
    return ((h.is_cuda or layers.FUSED_ON_CPU) and h.shape[0] <= MAX_ROWS and o.ggml_type not in FLOAT_VIEWS
            and name in SPECS and dot_length_fits(SPECS[name], o.shape[1]))


def chained_moe_layer(model, i: int, h: torch.Tensor, config, delta: torch.Tensor | None = None,
                      heads: torch.Tensor | None = None):
    """The end of MoE layer i of `model` from its residual h and either its mixer's output `delta` or its attention
    heads before the o projection (`heads`, where `folds_o`): (the new residual, its norm by `norm_after(i)`), as
    `DecoderLM.layer` gives them; None where the launch declines (then, given `heads`, the caller projects them and
    asks again with `delta`). Without a shared expert and with the decoder's own `join_add_norm`, the last add +
    norm is the launch's last phase; else the model joins after it."""
    from strata.kernels.moe.chain_moe import chain_moe_triton
    from strata.kernels.moe.gemv import DecodeExperts, ExpertOperand
    from strata.models.decoder import DecoderLM
    from strata.models.layers import _fused

    w, c = model.ffn[i], model.config
    next_norm = model.norm_after(i)
    join = (w.shared_gate is None and type(model).join_add_norm is DecoderLM.join_add_norm
            and _fused(h, next_norm))
    o = None
    if heads is not None:
        weight = model.attention[i].o
        o = ExpertOperand(weight.raw.contiguous().reshape(-1), int(weight.ggml_type), *weight.shape, stride=0)
    # (A router converted by this call needs no care: the chained launch reads it after its PDL wait.)
    out = chain_moe_triton(h, delta, w.norm, w.router.dequantize(h.dtype), c.rms_eps, c.n_experts_used,
                           c.norm_topk_prob, DecodeExperts.of_stack(model.experts.stacks[i]), site=i, config=config,
                           next_norm=next_norm if join else None, heads=heads, o=o)
    if out is None:
        return None
    if join:
        return out[3], out[4]
    h, x, routed = out
    return model.join_add_norm(i, h, routed, model.shared_swiglu(i, x, w), x)


def qkv_chain(model, i: int, x: torch.Tensor):
    """(ChainConfig, the stacked q/k/v operand) where attention layer i's projection of the normed rows x may run in
    one launch with its q/k norm + RoPE + store (kernels/pointwise/chain_qkv_store.py, through the context's
    `attend_projected`), else None: the switch on, a stacked q/k/v read at once by the quantized matvec
    (stacked_projections._one_matvec), no biases, q/k norms."""
    text = _switch()
    if text is None:
        return None
    from strata.kernels.moe.chain_moe import parse_config
    from strata.kernels.moe.gemv import ExpertOperand
    from strata.models.stacked_projections import _one_matvec
    from strata.models.weights import FLOAT_VIEWS

    w = model.attention[i]
    if (w.qkv is None or w.q_norm is None or any(b is not None for b in (w.q_bias, w.k_bias, w.v_bias))
            or w.qkv.ggml_type in FLOAT_VIEWS or x.dim() != 2 or not _one_matvec(x, w.qkv)):
        return None
    operand = ExpertOperand(w.qkv.raw.contiguous().reshape(-1), int(w.qkv.ggml_type), *w.qkv.shape, stride=0)
    return parse_config(text), operand
