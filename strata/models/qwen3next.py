"""Qwen3-Next (GGUF `qwen3next`): GatedDeltaNet layers with gated full attention every few layers, every layer MoE
with a sigmoid-gated shared expert.

Attention layers: q_proj gives per head [q (head_dim), output gate (head_dim)]; q and k are RMS-normed per head,
RoPE turns their first rope_dim dims (neox pairing), and the attention output is multiplied by sigmoid(gate).
llama.cpp bakes Qwen3-Next's (1 + w) RMSNorm weights into the file, so every norm here is a plain RMSNorm.
Trailing MTP blocks (nextn_predict_layers, llama.cpp's `blk.{n}.nextn.*`) draft tokens for speculative decoding:
`mtp_forward` (engine/spec.py drives it; docs/ARCHITECTURES.md has the formula and the checkpoint names).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from strata.engine.context import ForwardContext
from strata.engine.experts import ExpertBackend, ExpertStack, ResidentExperts
from strata.engine.hybrid_cache import HybridCache
from strata.engine.kv import KVBackend, new_kv_cache
from strata.errors import StrataError
from strata.gguf.reader import GGUFModelFile
from strata.models.config import ModelConfig
from strata.models.decoder import DecoderLM, FFNWeights, WeightLoader
from strata.models.gated_deltanet import GDNShape, GDNWeights, gated_deltanet
from strata.models.stacked_projections import stack_projections
from strata.models.layers import QKNorm, Rope, rms_norm
from strata.models.weights import QuantWeight, linear

GDN_TENSORS = ("attn_qkv.weight", "attn_gate.weight", "ssm_in.weight", "ssm_ba.weight", "ssm_conv1d.weight", "ssm_dt.bias", "ssm_a",
               "ssm_norm.weight", "ssm_out.weight")
ATTENTION_TENSORS = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight")


@dataclass
class GatedAttentionWeights:
    norm: torch.Tensor
    q: QuantWeight  # [heads x 2 head_dim, embd]: per head, the query then its output gate
    k: QuantWeight
    v: QuantWeight
    o: QuantWeight
    q_norm: torch.Tensor
    k_norm: torch.Tensor


@dataclass
class MTPWeights:
    """One multi-token-prediction block: the next token's embedding and the last hidden state, each RMS-normed,
    concatenated and projected (eh_proj), then an attention + MoE layer."""

    eh_proj: QuantWeight  # [embd, 2 embd]
    enorm: torch.Tensor
    hnorm: torch.Tensor
    attention: GatedAttentionWeights
    ffn: FFNWeights
    shared_head_norm: torch.Tensor | None = None


class Qwen3NextLM(DecoderLM):
    """Token ids in, logits out; GatedDeltaNet states and attention keys/values live in a HybridCache."""

    dp4a_wired = False  # STRATA_DP4A: not wired yet (its own attention and norms; models/dp4a_step.py)

    def __init__(self, config: ModelConfig, model: GGUFModelFile, device: torch.device, dtype: torch.dtype,
                 experts: ExpertBackend | None = None, progress: bool = False, expert_device: torch.device | None = None,
                 split=None):
        self.config, self.device, self.dtype, self.split = config, device, dtype, split
        self.expert_device = expert_device  # where the routed experts are loaded (the host when offloaded)
        self.source = str(model.path)
        c, load = config, WeightLoader(model, device, dtype, progress, split)
        if not c.is_hybrid:
            raise StrataError(f"{model.path}: {c.arch} needs the ssm.* metadata fields (ssm.inner_size is missing)")
        if not c.is_moe:
            raise StrataError(f"{model.path}: {c.arch} needs routed experts (expert_count is missing)")
        self.gdn = GDNShape(n_k_heads=c.ssm_group_count, n_v_heads=c.ssm_time_step_rank, k_dim=c.ssm_state_size,
                            v_dim=c.ssm_inner_size // c.ssm_time_step_rank, conv_kernel=c.ssm_conv_kernel)
        self.n_main = c.n_layers - c.nextn_layers
        self.recurrent = c.recurrent_layers[: self.n_main]
        self._check_layer_kinds(model)
        self.embed = load.quant("token_embd.weight", c.vocab_size, c.n_embd)
        self.output_norm = load.dense("output_norm.weight", c.n_embd)
        self.output = self.embed if c.tied_embeddings else load.quant("output.weight", c.vocab_size, c.n_embd)
        self.mixers: list[GDNWeights | GatedAttentionWeights] = []
        self.ffn: list[FFNWeights] = []
        stacks: dict[int, ExpertStack] = {}
        for i in range(self.n_main):
            p = f"blk.{i}."
            self.mixers.append(self._load_gdn(load, p) if self.recurrent[i] else self._load_attention(load, p))
            self.ffn.append(self._load_moe(load, p, i, stacks))
        self.mtp = [self._load_mtp(load, i, stacks) for i in range(self.n_main, c.n_layers)]
        self.experts = experts if experts is not None else ResidentExperts(stacks)
        self.expert_stacks = stacks
        self.rope = Rope(c.rope_dim or c.head_dim, c.rope_theta, device)
        load.bar.close()

    # ------------------------------------------------------------------------------------------ loading

    def _check_layer_kinds(self, model: GGUFModelFile) -> None:
        """Each layer's tensors must be those of the mixer the layer pattern gives it."""
        arch = self.config.arch
        key = f"{arch}.attention.recurrent_layers"
        field = key if key in model.metadata else f"{arch}.full_attention_interval"
        for i, recurrent in enumerate(self.recurrent):
            foreign = ATTENTION_TENSORS if recurrent else GDN_TENSORS
            for name in foreign:
                if f"blk.{i}.{name}" in model.tensors:
                    kind = "a GatedDeltaNet" if recurrent else "an attention"
                    raise StrataError(f"{model.path}: tensor blk.{i}.{name} does not belong in layer {i}, which is "
                                      f"{kind} layer by {field}={model.metadata.get(field, 4)!r}")

    def _load_gdn(self, load: WeightLoader, p: str) -> GDNWeights:
        c, s = self.config, self.gdn
        value_dim = s.n_v_heads * s.v_dim
        ba = load.quant(p + "ssm_ba.weight", 2 * s.n_v_heads, c.n_embd)
        b_rows, a_rows = s.ba_rows()
        if p + "attn_qkv.weight" not in load.model.tensors and p + "ssm_in.weight" in load.model.tensors:
            # Older converters wrote in_proj_qkvz unsplit; llama.cpp still reads it, so do we (rows picked once).
            fused = load.quant(p + "ssm_in.weight", s.conv_channels + value_dim, c.n_embd)
            qkv_rows, z_rows = s.qkvz_rows()
            qkv, gate = fused[qkv_rows], fused[z_rows]
        else:
            qkv = load.quant(p + "attn_qkv.weight", s.conv_channels, c.n_embd)
            gate = load.quant(p + "attn_gate.weight", value_dim, c.n_embd)
        # A decode step on the GPU reads qkv, gate (and b, a) through one matvec: one block tensor, these views.
        inputs, parts, (qkv, gate, b, a) = stack_projections(p + "gdn_inputs", (qkv, gate, ba[b_rows], ba[a_rows]),
                                                             (4, 2))
        return GDNWeights(
            norm=load.dense(p + "attn_norm.weight", c.n_embd),
            qkv=qkv,
            gate=gate,
            b=b,
            a=a,
            conv=load.dense(p + "ssm_conv1d.weight", s.conv_channels, s.conv_kernel),
            dt_bias=load.dense(p + "ssm_dt.bias", s.n_v_heads),
            decay_rate=load.quant(p + "ssm_a", s.n_v_heads).dequantize(torch.float32),
            out_norm=load.dense(p + "ssm_norm.weight", s.v_dim),
            out=load.quant(p + "ssm_out.weight", c.n_embd, value_dim),
            inputs=inputs,
            inputs_parts=parts,
        )

    def _load_attention(self, load: WeightLoader, p: str) -> GatedAttentionWeights:
        c = self.config
        q_dim, kv_dim = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
        return GatedAttentionWeights(
            norm=load.dense(p + "attn_norm.weight", c.n_embd),
            q=load.quant(p + "attn_q.weight", 2 * q_dim, c.n_embd),
            k=load.quant(p + "attn_k.weight", kv_dim, c.n_embd),
            v=load.quant(p + "attn_v.weight", kv_dim, c.n_embd),
            o=load.quant(p + "attn_output.weight", c.n_embd, q_dim),
            q_norm=load.dense(p + "attn_q_norm.weight", c.head_dim),
            k_norm=load.dense(p + "attn_k_norm.weight", c.head_dim),
        )

    def _load_moe(self, load: WeightLoader, p: str, layer: int, stacks: dict[int, ExpertStack]) -> FFNWeights:
        c, sff = self.config, self.config.shared_expert_ff
        on = self.expert_device
        stacks[layer] = ExpertStack(
            gate=load.quant(p + "ffn_gate_exps.weight", c.n_experts, c.expert_ff, c.n_embd, device=on),
            up=load.quant(p + "ffn_up_exps.weight", c.n_experts, c.expert_ff, c.n_embd, device=on),
            down=load.quant(p + "ffn_down_exps.weight", c.n_experts, c.n_embd, c.expert_ff, device=on),
        )
        shared_router = p + "ffn_gate_inp_shexp.weight"
        # llama.cpp's converter writes the shared expert's gate as [1, embd]; its loader also takes [embd]
        router_shape = (1, c.n_embd) if load.model.tensor(shared_router).shape == (1, c.n_embd) else (c.n_embd,)
        return FFNWeights(
            norm=load.dense(p + "post_attention_norm.weight", c.n_embd),
            router=load.quant(p + "ffn_gate_inp.weight", c.n_experts, c.n_embd),
            shared_gate=load.quant(p + "ffn_gate_shexp.weight", sff, c.n_embd),
            shared_up=load.quant(p + "ffn_up_shexp.weight", sff, c.n_embd),
            shared_down=load.quant(p + "ffn_down_shexp.weight", c.n_embd, sff),
            shared_router=load.dense(shared_router, *router_shape).reshape(c.n_embd),
        )

    def _load_mtp(self, load: WeightLoader, layer: int, stacks: dict[int, ExpertStack]) -> MTPWeights:
        c, p = self.config, f"blk.{layer}."
        return MTPWeights(
            eh_proj=load.quant(p + "nextn.eh_proj.weight", c.n_embd, 2 * c.n_embd),
            enorm=load.dense(p + "nextn.enorm.weight", c.n_embd),
            hnorm=load.dense(p + "nextn.hnorm.weight", c.n_embd),
            attention=self._load_attention(load, p),
            ffn=self._load_moe(load, p, layer, stacks),
            shared_head_norm=load.optional_dense(p + "nextn.shared_head_norm.weight", c.n_embd),
        )

    # ------------------------------------------------------------------------------------------ running

    def new_cache(self, max_tokens: int, kv_dtype: str | torch.dtype) -> HybridCache:
        c = self.config
        placed = {}
        if self.split is not None:  # each card keeps its own layers' states, keys and values
            from strata.engine.split_cache import split_kv

            attention = [i for i, r in enumerate(self.recurrent) if not r]
            placed = dict(layer_devices=[self.split.devices[self.split.stage_of(i)] for i in range(self.n_main)],
                          kv=split_kv(kv_dtype, attention, self.split, c.n_kv_heads, c.head_dim, max_tokens))
        return HybridCache(self.recurrent, c.n_kv_heads, c.head_dim, self.gdn.conv_state_shape, self.gdn.state_shape,
                           max_tokens, kv_dtype, self.dtype, self.device, **placed)

    def new_mtp_cache(self, max_tokens: int, kv_dtype: str | torch.dtype) -> KVBackend:
        """Keys and values of the MTP blocks' attention (one slot per block), apart from the trunk's cache."""
        c = self.config
        on = self.mtp[0].eh_proj.device if self.mtp else self.device  # beside the blocks (a split: the last card)
        return new_kv_cache(kv_dtype, max(1, len(self.mtp)), c.n_kv_heads, c.head_dim, max_tokens, on)

    def _attention(self, i: int, h: torch.Tensor, ctx: ForwardContext, cos, sin,
                   x: torch.Tensor | None = None) -> torch.Tensor:
        return self._gated_attention(self.mixers[i], i, h, ctx, cos, sin, x)

    def _gated_attention(self, w: GatedAttentionWeights, slot: int, h: torch.Tensor, ctx: ForwardContext,
                         cos, sin, x: torch.Tensor | None = None) -> torch.Tensor:
        c = self.config
        n_tokens = h.shape[0]
        x = rms_norm(h, w.norm, c.rms_eps) if x is None else x
        q, gate = linear(x, w.q).view(n_tokens, c.n_heads, 2 * c.head_dim).split(c.head_dim, dim=-1)
        k = linear(x, w.k).view(n_tokens, c.n_kv_heads, c.head_dim)
        v = linear(x, w.v).view(n_tokens, c.n_kv_heads, c.head_dim)
        # Per-head norms, then RoPE on the leading cos.shape[-1] dims of each head; the rest pass through.
        out = ctx.attend_normed(slot, q, k, v, QKNorm(w.q_norm, w.k_norm, c.rms_eps, cos, sin))
        out = out * torch.sigmoid(gate)
        return linear(out.reshape(n_tokens, c.n_heads * c.head_dim), w.o)

    def _gated_deltanet(self, i: int, h: torch.Tensor, cache: HybridCache, row_states: bool = False,
                        x: torch.Tensor | None = None) -> torch.Tensor:
        out, conv, state = gated_deltanet(self.mixers[i], self.gdn, h, cache.conv[i], cache.state[i],
                                          self.config.rms_eps, row_states, x)
        if row_states:
            cache.keep_row_states(i, conv, state)
        else:
            if conv is not cache.conv[i]:  # the decode-step kernel wrote it in place
                cache.conv[i].copy_(conv)
            cache.state[i].copy_(state)
        return out

    def mtp_forward(self, hidden: torch.Tensor, ids: torch.Tensor, cache: KVBackend, start: int,
                    block: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """MTP block `block` over cells start..start+n-1: cell i pairs the final normed hidden state at position i
        (the trunk's, or this block's own output for a draft after a draft) with the token at i+1, and predicts
        the token at i+2. hidden [n, embd], ids [n] -> (logits float32 [n, vocab], the block's output [n, embd])."""
        if not self.mtp:
            raise StrataError(f"{self.source}: this model has no MTP block (nextn_predict_layers is 0)")
        cache.reserve(start + ids.shape[0])
        return self.mtp_step(hidden, ids, ForwardContext(cache, start, ids.shape[0]), block)

    def mtp_step(self, hidden: torch.Tensor, ids: torch.Tensor, ctx: ForwardContext,
                 block: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """`mtp_forward`'s work over a context the caller set up (its cache reserved): the eager step's, or a
        static one whose positions are a device tensor (engine/spec_mtp.py captures it)."""
        w, c = self.mtp[block], self.config
        on = w.eh_proj.device  # a layer split keeps the MTP blocks with the head, on the last card
        embedded = rms_norm(self.embed_tokens(ids).to(on), w.enorm, c.rms_eps)
        x = linear(torch.cat((embedded, rms_norm(hidden.to(on, self.dtype), w.hnorm, c.rms_eps)), dim=-1), w.eh_proj)
        cos, sin = (t.to(on) for t in self.rope.cos_sin(ctx.positions(self.device), self.dtype))
        x = x + self._gated_attention(w.attention, block, x, ctx, cos, sin)
        x = x + self._ffn(self.n_main + block, x, w.ffn)
        out = rms_norm(x, w.shared_head_norm if w.shared_head_norm is not None else self.output_norm, c.rms_eps)
        return linear(out, self.output).float(), out

    @property
    def n_main_layers(self) -> int:
        return self.n_main

    def begin(self, ids: torch.Tensor, ctx: ForwardContext) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cache = ctx.kv
        if not isinstance(cache, HybridCache):
            raise StrataError(f"{self.source}: {self.config.arch} needs the HybridCache of new_cache(), "
                              f"got {type(cache).__name__}")
        cache.check(self.source, self.recurrent, self.gdn.conv_state_shape, self.gdn.state_shape)
        cache.begin(ctx.start, ctx.n_tokens)
        h = self.embed_tokens(ids)
        cos, sin = self.rope.cos_sin(ctx.positions(self.device), self.dtype)
        return h, cos, sin

    def mixer(self, i: int, h: torch.Tensor, ctx: ForwardContext, cos, sin,
              x: torch.Tensor | None = None) -> torch.Tensor:
        if self.recurrent[i]:
            return self._gated_deltanet(i, h, ctx.kv, ctx.keep_row_states, x)
        return self._attention(i, h, ctx, cos, sin, x)

    def mixer_norm(self, i: int) -> torch.Tensor:
        return self.mixers[i].norm
