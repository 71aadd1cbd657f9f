"""qwen4exp's multi-token-prediction (MTP) block: from the trunk's final residual stack at position i and the token
at i+1, logits for the token at i+2 (Strata's include/strata/core/mtp.hpp, src/core/mtp.cpp `record_forward`).

    e = fc_embedding @ (rmsnorm(token_embd[t_{i+1}]) * norm_embedding)            [embd]
    h = fc_hidden @ (rmsnorm(R_i as one hc*embd vector) * norm_hidden)[c]         per stream (one RMS over all)
    R = h + e  ->  hc_read / QSA attention (own K/V, dense, RoPE at position i) / hc_write
               ->  hc_read / MoE / hc_write  ->  hc_read(final mixer, no inject)  ->  output.weight

Strata keeps these weights outside the GGUF (tools/mtp_rt.py); here they are the block after the trunk,
`blk.{n_main}` (nextn_predict_layers = 1), with a QSA layer's names and `nextn.*` for the rest (docs/ARCHITECTURES.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from strata.models.hyper_connections import HyperConnectionWeights
from strata.models.layers import rms_norm
from strata.models.weights import QuantWeight, linear

NEXTN_TENSORS = ("nextn.fc_embedding.weight", "nextn.fc_hidden.weight", "nextn.norm_embedding.weight",
                 "nextn.norm_hidden.weight")


@dataclass
class MTPWeights:
    fc_embedding: QuantWeight  # [embd, embd]
    fc_hidden: QuantWeight  # [embd, embd], applied to each stream
    norm_embedding: torch.Tensor  # [embd]
    norm_hidden: torch.Tensor  # [hc * embd]
    hc_out: HyperConnectionWeights  # the final mixer before the head (no inject)


def mtp_input(w: MTPWeights, residual: torch.Tensor, next_embedding: torch.Tensor, eps: float) -> torch.Tensor:
    """The block's input stack [T, hc, embd] from the trunk's final stack [T, hc, embd] and the next tokens'
    embeddings [T, embd]."""
    n_tokens, hc, embd = residual.shape
    e = linear(rms_norm(next_embedding.float(), w.norm_embedding.float(), eps), w.fc_embedding)
    hn = rms_norm(residual.float().reshape(n_tokens, hc * embd), w.norm_hidden.float(), eps)
    h = linear(hn.view(n_tokens, hc, embd), w.fc_hidden)
    return h + e[:, None, :]
