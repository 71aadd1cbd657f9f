"""Qwen3-Next's multi-token-prediction (MTP) head, trained beside transformers' Qwen3NextForCausalLM.

transformers has no MTP module (it drops `mtp.*` on load), so this one follows the form the serving engines read
from the real checkpoints (vLLM's and SGLang's qwen3_next_mtp): at position t it takes the main model's final,
normed hidden state h_t and the embedding of the next token x_{t+1}, and predicts x_{t+2}:

    e = pre_fc_norm_embedding(embed(x_{t+1}));  h = pre_fc_norm_hidden(h_t)
    y = layers[0](fc(concat(e, h)))              # one full-attention decoder layer with the MoE
    logits = lm_head(norm(y))                    # embedding and head shared with the main model

All norms are Qwen3-Next's (1 + w) RMSNorms. Its parameters are saved under the checkpoint names
`mtp.fc.weight`, `mtp.pre_fc_norm_embedding.weight`, `mtp.pre_fc_norm_hidden.weight`, `mtp.layers.0.*`,
`mtp.norm.weight`.
"""

from __future__ import annotations

import copy

import torch
from torch import nn


class Qwen3NextMTP(nn.Module):
    def __init__(self, config):
        from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextDecoderLayer, Qwen3NextRMSNorm

        super().__init__()
        hidden = config.hidden_size
        layer_config = copy.deepcopy(config)
        layer_config.layer_types = ["full_attention"]  # the MTP layer is always a gated full-attention layer
        layer_config.num_hidden_layers = 1
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.pre_fc_norm_embedding = Qwen3NextRMSNorm(hidden, eps=config.rms_norm_eps)
        self.pre_fc_norm_hidden = Qwen3NextRMSNorm(hidden, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList([Qwen3NextDecoderLayer(layer_config, layer_idx=0)])
        self.norm = Qwen3NextRMSNorm(hidden, eps=config.rms_norm_eps)

    @classmethod
    def for_model(cls, causal_lm: nn.Module) -> Qwen3NextMTP:
        """A head for `causal_lm`, its parameters drawn by the model's own init (the experts are torch.empty)."""
        head = cls(causal_lm.config)
        head.apply(causal_lm._init_weights)
        return head

    def forward(self, causal_lm: nn.Module, final_hidden: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
        """Logits for x_{t+2} at every t: `final_hidden` [B, T, H] (normed h_t), `next_ids` [B, T] (x_{t+1})."""
        embedded = self.pre_fc_norm_embedding(causal_lm.model.embed_tokens(next_ids))
        hidden = self.fc(torch.cat([embedded, self.pre_fc_norm_hidden(final_hidden)], dim=-1))
        positions = torch.arange(1, next_ids.shape[1] + 1, device=next_ids.device)[None].expand_as(next_ids)
        rotary = causal_lm.model.rotary_emb(hidden, positions)
        for layer in self.layers:  # no mask: SDPA runs causal
            hidden = layer(hidden, position_embeddings=rotary, position_ids=positions)
        return causal_lm.lm_head(self.norm(hidden))

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        """This head's parameters under the real Qwen3-Next checkpoint names: experts one by one
        (`mtp.layers.0.mlp.experts.{e}.gate_proj.weight`, ...), as save_pretrained writes the main model's."""
        tensors = {}
        for name, param in self.state_dict().items():
            value = param.detach()
            if name.endswith("mlp.experts.gate_up_proj"):  # [E, 2 * n_ff, hidden], gate rows first
                prefix = name.removesuffix("gate_up_proj")
                for expert, (gate, up) in enumerate(zip(*value.chunk(2, dim=1))):
                    tensors[f"mtp.{prefix}{expert}.gate_proj.weight"] = gate.contiguous()
                    tensors[f"mtp.{prefix}{expert}.up_proj.weight"] = up.contiguous()
            elif name.endswith("mlp.experts.down_proj"):  # [E, hidden, n_ff]
                prefix = name.removesuffix("down_proj")
                for expert, down in enumerate(value):
                    tensors[f"mtp.{prefix}{expert}.down_proj.weight"] = down.contiguous()
            else:
                tensors[f"mtp.{name}"] = value.contiguous()
        return tensors

    def load_checkpoint_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """The inverse of checkpoint_tensors."""
        state = {}
        for name, param in self.state_dict().items():
            if name.endswith("mlp.experts.gate_up_proj"):
                prefix = "mtp." + name.removesuffix("gate_up_proj")
                state[name] = torch.stack([
                    torch.cat([tensors[f"{prefix}{e}.gate_proj.weight"], tensors[f"{prefix}{e}.up_proj.weight"]])
                    for e in range(param.shape[0])
                ])
            elif name.endswith("mlp.experts.down_proj"):
                prefix = "mtp." + name.removesuffix("down_proj")
                state[name] = torch.stack([tensors[f"{prefix}{e}.down_proj.weight"] for e in range(param.shape[0])])
            else:
                state[name] = tensors[f"mtp.{name}"]
        self.load_state_dict(state)
