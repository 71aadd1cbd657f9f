"""The attention + FFN decoder of Qwen2, Qwen3 and Qwen3-MoE (and Qwen2-MoE's shared expert), on llama.cpp's names.

One file serves the three GGUF architectures because they differ only in flags the file itself shows:
QKV bias (qwen2), per-head QK RMSNorm (qwen3*), and routed experts in place of the dense FFN (*moe).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from strata.engine.context import ForwardContext
from strata.engine.kv import KVBackend, new_kv_cache
from strata.engine.experts import ExpertBackend, ExpertStack, PendingExperts, ResidentExperts
from strata.errors import StrataError
from strata.gguf.reader import GGUFModelFile
from strata.models import dp4a_step
from strata.models.config import ModelConfig
from strata.models.balanced_routing import balanced_routing
from strata.models.layers import (ROUTE_KERNEL_MAX_TOKENS, QKNorm, Rope, add_gated_shared, add_norm_route,
                                  add_rms_norm, embed_rows, rms_norm, route_topk, shared_gate_add_rms_norm, swiglu)
from strata.models.moe_chain import chain_config, chained_moe_layer, folds_o, qkv_chain
from strata.models.stacked_projections import project_inputs, stack_projections
from strata.models.weights import QuantWeight, linear


@dataclass
class AttentionWeights:
    norm: torch.Tensor
    q: QuantWeight
    k: QuantWeight
    v: QuantWeight
    o: QuantWeight
    q_bias: torch.Tensor | None = None
    k_bias: torch.Tensor | None = None
    v_bias: torch.Tensor | None = None
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    qkv: QuantWeight | None = None  # on a GPU, q, k and v's rows in one block tensor (q, k, v: views of it)


@dataclass
class FFNWeights:
    norm: torch.Tensor | None  # None where the input arrives normalised (qwen4exp's hyper-connection read)
    gate: QuantWeight | None = None  # dense FFN
    up: QuantWeight | None = None
    down: QuantWeight | None = None
    router: QuantWeight | None = None  # MoE
    shared_gate: QuantWeight | None = None
    shared_up: QuantWeight | None = None
    shared_down: QuantWeight | None = None
    shared_router: torch.Tensor | None = None  # [embd]: sigmoid gate of the shared expert


class WeightLoader:
    """Fetches tensors by llama.cpp name, checks their shapes, and places them on the device."""

    def __init__(self, model: GGUFModelFile, device: torch.device, dtype: torch.dtype, progress: bool = False,
                 split=None):
        """`split`: a LayerSplit (engine/placement_split.py) placing each layer's tensors on its card."""
        from tqdm import tqdm

        self.model, self.device, self.dtype, self.split = model, device, dtype, split
        total = sum(t.n_bytes for t in model.tensors.values())
        self.bar = tqdm(total=total, unit="B", unit_scale=True, desc="loading", disable=None if progress else True, leave=False)

    def _info(self, name: str, shape: tuple[int, ...]):
        info = self.model.tensor(name)
        if tuple(info.shape) != tuple(shape):
            raise StrataError(f"{self.model.path}: tensor {name} has shape {list(info.shape)}, expected {list(shape)}")
        self.bar.update(info.n_bytes)
        return info

    def device_of(self, name: str) -> torch.device:
        return self.device if self.split is None else self.split.device_of_tensor(name)

    def quant(self, name: str, *shape: int, device: torch.device | None = None) -> QuantWeight:
        return QuantWeight.from_info(self._info(name, shape), device or self.device_of(name))

    def dense(self, name: str, *shape: int) -> torch.Tensor:
        """A small tensor (norm, bias) dequantized once into the compute dtype."""
        return QuantWeight.from_info(self._info(name, shape), self.device_of(name)).dequantize(self.dtype)

    def optional_dense(self, name: str, *shape: int) -> torch.Tensor | None:
        return self.dense(name, *shape) if name in self.model.tensors else None

    def optional_quant(self, name: str, *shape: int) -> QuantWeight | None:
        return self.quant(name, *shape) if name in self.model.tensors else None


class DecoderLM:
    """Token ids in, logits out; keys and values go to the KV cache named by the forward context."""

    balanced_prompt_routing = False  # `bench prompt --routing balanced` (models/balanced_routing.py): timing only
    dp4a_wired = True  # STRATA_DP4A (models/dp4a_step.py) takes this class's Q4_0 decode matvecs

    def __init__(self, config: ModelConfig, model: GGUFModelFile, device: torch.device, dtype: torch.dtype,
                 experts: ExpertBackend | None = None, progress: bool = False, expert_device: torch.device | None = None,
                 split=None):
        self.config, self.device, self.dtype, self.split = config, device, dtype, split
        c, load = config, WeightLoader(model, device, dtype, progress, split)
        self.embed = load.quant("token_embd.weight", c.vocab_size, c.n_embd)
        self.output_norm = load.dense("output_norm.weight", c.n_embd)
        self.output = self.embed if c.tied_embeddings else load.quant("output.weight", c.vocab_size, c.n_embd)
        q_dim, kv_dim = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
        self.attention: list[AttentionWeights] = []
        self.ffn: list[FFNWeights] = []
        stacks: dict[int, ExpertStack] = {}
        for i in range(c.n_layers):
            p = f"blk.{i}."
            q, k, v = (load.quant(p + f"attn_{x}.weight", rows, c.n_embd)
                       for x, rows in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)))
            # A decode step on the GPU reads the three through one matvec launch instead of three.
            qkv, _, (q, k, v) = stack_projections(p + "attn_qkv", (q, k, v), (3,))
            self.attention.append(AttentionWeights(
                norm=load.dense(p + "attn_norm.weight", c.n_embd),
                q=q, k=k, v=v, qkv=qkv,
                o=load.quant(p + "attn_output.weight", c.n_embd, q_dim),
                q_bias=load.optional_dense(p + "attn_q.bias", q_dim),
                k_bias=load.optional_dense(p + "attn_k.bias", kv_dim),
                v_bias=load.optional_dense(p + "attn_v.bias", kv_dim),
                q_norm=load.optional_dense(p + "attn_q_norm.weight", c.head_dim),
                k_norm=load.optional_dense(p + "attn_k_norm.weight", c.head_dim),
            ))
            norm = load.dense(p + "ffn_norm.weight", c.n_embd)
            if p + "ffn_gate_inp.weight" in model.tensors:
                stacks[i] = ExpertStack(
                    gate=load.quant(p + "ffn_gate_exps.weight", c.n_experts, c.expert_ff, c.n_embd, device=expert_device),
                    up=load.quant(p + "ffn_up_exps.weight", c.n_experts, c.expert_ff, c.n_embd, device=expert_device),
                    down=load.quant(p + "ffn_down_exps.weight", c.n_experts, c.n_embd, c.expert_ff, device=expert_device),
                )
                sff = c.shared_expert_ff
                self.ffn.append(FFNWeights(
                    norm=norm,
                    router=load.quant(p + "ffn_gate_inp.weight", c.n_experts, c.n_embd),
                    shared_gate=load.optional_quant(p + "ffn_gate_shexp.weight", sff, c.n_embd),
                    shared_up=load.optional_quant(p + "ffn_up_shexp.weight", sff, c.n_embd),
                    shared_down=load.optional_quant(p + "ffn_down_shexp.weight", c.n_embd, sff),
                    shared_router=load.optional_dense(p + "ffn_gate_inp_shexp.weight", c.n_embd),
                ))
            else:
                self.ffn.append(FFNWeights(
                    norm=norm,
                    gate=load.quant(p + "ffn_gate.weight", c.n_ff, c.n_embd),
                    up=load.quant(p + "ffn_up.weight", c.n_ff, c.n_embd),
                    down=load.quant(p + "ffn_down.weight", c.n_embd, c.n_ff),
                ))
        self.experts = experts if experts is not None else ResidentExperts(stacks)
        self.expert_stacks = stacks
        self.rope = Rope(c.head_dim, c.rope_theta, device)
        load.bar.close()

    def new_cache(self, max_tokens: int, kv_dtype: str | torch.dtype) -> KVBackend:
        """The KV backend named by kv_dtype (engine/kv.py): "float16", "bfloat16", "float32", "int8"."""
        c = self.config
        if self.split is not None:  # each card keeps its own layers' keys and values
            from strata.engine.split_cache import split_kv

            return split_kv(kv_dtype, list(range(c.n_layers)), self.split, c.n_kv_heads, c.head_dim, max_tokens)
        return new_kv_cache(kv_dtype, c.n_layers, c.n_kv_heads, c.head_dim, max_tokens, self.device)

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        # Dequantize only the rows asked for, not the whole vocabulary.
        return embed_rows(self.embed, ids, self.dtype)

    def _attention(self, i: int, h: torch.Tensor, ctx: ForwardContext, cos, sin,
                   x: torch.Tensor | None = None) -> torch.Tensor:
        heads = self._attention_heads(i, h, ctx, cos, sin, x)
        out = dp4a_step.matvec(heads, self.attention[i].o, "o") if self.dp4a_wired else None  # STRATA_DP4A
        return linear(heads, self.attention[i].o) if out is None else out

    def _attention_heads(self, i: int, h: torch.Tensor, ctx: ForwardContext, cos, sin,
                         x: torch.Tensor | None = None) -> torch.Tensor:
        """`_attention` before its o projection: the heads [T, n_heads * head_dim] (STRATA_DECODE_CHAIN projects
        them in its launch)."""
        w, c = self.attention[i], self.config
        x = rms_norm(h, w.norm, c.rms_eps) if x is None else x
        chain = qkv_chain(self, i, x)  # STRATA_DECODE_CHAIN: the projection with the norm + RoPE + store
        if chain is not None:
            out = ctx.attend_projected(i, x, chain[1], (c.n_heads, c.n_kv_heads, c.head_dim),
                                       QKNorm(w.q_norm, w.k_norm, c.rms_eps, cos, sin), chain[0])
            if out is not None:
                return out.reshape(-1, c.n_heads * c.head_dim)
        qkv = dp4a_step.matvec(x, w.qkv, "qkv") if self.dp4a_wired and w.qkv is not None else None  # STRATA_DP4A
        if qkv is None:
            q, k, v = project_inputs(x, w.qkv, 3, (w.q, w.k, w.v), (w.q_bias, w.k_bias, w.v_bias))
        else:
            q, k, v = (t if b is None else t + b for t, b in zip(qkv.split([w.q.shape[0], w.k.shape[0],
                                                                         w.v.shape[0]], dim=-1),
                                                                (w.q_bias, w.k_bias, w.v_bias)))
        q, k, v = (t.view(-1, n, c.head_dim) for t, n in ((q, c.n_heads), (k, c.n_kv_heads), (v, c.n_kv_heads)))
        if w.q_norm is not None:  # the norms and RoPE in the backend: a static step stores the keys in that launch
            out = ctx.attend_normed(i, q, k, v, QKNorm(w.q_norm, w.k_norm, c.rms_eps, cos, sin))
        else:
            out = ctx.attend(i, Rope.apply(q, cos, sin), Rope.apply(k, cos, sin), v)
        return out.reshape(-1, c.n_heads * c.head_dim)

    def is_moe(self, i: int) -> bool:
        return self.ffn[i].router is not None

    def route(self, i: int, h: torch.Tensor, w: FFNWeights | None = None,
              x: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """An MoE layer's input and routing: (normed x [T, embd], weights [T, k] float32, expert ids [T, k]); `w`
        gives other weights for the same expert layer index (an MTP block); `x`, h already normed."""
        w, c = w or self.ffn[i], self.config
        x = rms_norm(h, w.norm, c.rms_eps) if x is None else x
        weights, ids = route_topk(linear(x, w.router), c.n_experts_used, c.norm_topk_prob)
        return x, weights, ids

    def shared_swiglu(self, i: int, x: torch.Tensor, w: FFNWeights | None = None) -> torch.Tensor | None:
        """The shared expert's output before its sigmoid gate (`with_shared` applies it), or None."""
        w = w or self.ffn[i]
        return None if w.shared_gate is None else swiglu(x, w.shared_gate, w.shared_up, w.shared_down)

    def with_shared(self, i: int, routed: torch.Tensor, shared: torch.Tensor | None, x: torch.Tensor,
                    w: FFNWeights | None = None) -> torch.Tensor:
        """The routed experts' sum joined by the (gated) shared expert's output of `shared_swiglu`."""
        w = w or self.ffn[i]
        if shared is None:
            return routed
        if w.shared_router is None:
            return routed + shared
        return add_gated_shared(routed, shared, x, w.shared_router)

    def _ffn(self, i: int, h: torch.Tensor, w: FFNWeights | None = None, x: torch.Tensor | None = None) -> torch.Tensor:
        """Layer i's FFN (or MoE); `w` gives other weights for the same expert layer index (an MTP block); `x`, h
        already normed by the FFN's norm."""
        w = w or self.ffn[i]
        return self._feed_forward(i, rms_norm(h, w.norm, self.config.rms_eps) if x is None else x, w)

    def _feed_forward(self, i: int, x: torch.Tensor, w: FFNWeights | None = None,
                      routing: tuple[torch.Tensor, torch.Tensor] | None = None, joined: bool = True):
        """Layer i's FFN (dense, or routed experts plus the gated shared expert) of its normalised input x; `routing`
        (weights, ids) when already computed with the norm (`add_norm_route`); `joined=False` (an MoE layer): the
        routed sum and the shared expert's output apart, for `join_add_norm`."""
        w, c = w or self.ffn[i], self.config
        if w.router is None:
            return swiglu(x, w.gate, w.up, w.down)
        # int32 ids where the routing kernel runs: what the expert kernels read, without a conversion launch.
        weights, ids = routing or route_topk(linear(x, w.router), c.n_experts_used, c.norm_topk_prob, torch.int32)
        if self.balanced_prompt_routing and x.shape[0] > ROUTE_KERNEL_MAX_TOKENS:
            weights, ids = balanced_routing(x.shape[0], c.n_experts_used, c.n_experts, i, x.device, ids.dtype)
        stack = dp4a_step.resident_stack(self, i, w)  # STRATA_DP4A
        routed = None if stack is None else dp4a_step.routed_experts(stack, x, weights, ids)
        pending = self.experts.start(i, x, weights, ids) if routed is None else PendingExperts(routed)
        # The shared expert runs while experts computed elsewhere (the CPU pool) are still in flight.
        shared = self.shared_swiglu(i, x, w)
        return self.with_shared(i, pending.finish(), shared, x, w) if joined else (pending.finish(), shared)

    def join_add_norm(self, i: int, h: torch.Tensor, routed: torch.Tensor, shared: torch.Tensor | None,
                      x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The end of MoE layer i: the routed sum joined by the shared expert (`with_shared`), added to the residual h
        and normed by `norm_after(i)`; one launch for a gated shared expert where the kernel takes it."""
        w, eps = self.ffn[i], self.config.rms_eps
        if shared is not None and w.shared_router is not None:
            done = shared_gate_add_rms_norm(h, routed, shared, x, w.shared_router, self.norm_after(i), eps)
            if done is not None:
                return done
        return add_rms_norm(h, self.with_shared(i, routed, shared, x, w), self.norm_after(i), eps,
                            quantize=dp4a_step.reads_qkv(self, i + 1))

    @property
    def n_main_layers(self) -> int:
        """The layers a forward step runs (Qwen3-Next's trailing MTP blocks are not among them)."""
        return self.config.n_layers

    def begin(self, ids: torch.Tensor, ctx: ForwardContext) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Start of a step: (embedded ids, RoPE cos, sin)."""
        ctx.kv.reserve(ctx.start + ctx.n_tokens)
        cos, sin = self.rope.cos_sin(ctx.positions(self.device), self.dtype)
        return self.embed_tokens(ids), cos, sin

    def mixer(self, i: int, h: torch.Tensor, ctx: ForwardContext, cos, sin,
              x: torch.Tensor | None = None) -> torch.Tensor:
        """Layer i's token mixer (attention here), to be added to the residual h; `x`, h already normed by
        `mixer_norm(i)` (the residual add before it fused with the norm)."""
        return self._attention(i, h, ctx, cos, sin, x)

    def mixer_norm(self, i: int) -> torch.Tensor:
        return self.attention[i].norm

    def norm_after(self, i: int) -> torch.Tensor:
        """The norm weight that reads the residual after layer i: the next mixer's, or the output norm."""
        return self.mixer_norm(i + 1) if i + 1 < self.n_main_layers else self.output_norm

    def layer(self, i: int, h: torch.Tensor, x: torch.Tensor, ctx: ForwardContext, cos,
              sin) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer i from the residual h and its normed form x: (the new residual, its norm by `norm_after(i)`).
        Each residual add runs with the norm that reads it (one launch on the GPU), with an MoE layer's routing and
        its shared expert's gate where their kernels take them."""
        c, w = self.config, self.ffn[i]
        # STRATA_DECODE_CHAIN: the layer's o projection (where foldable), MoE half and closing norm in one launch;
        # where the launch declines, the layer goes on with the mixer's output as usual.
        chain = None if w.router is None else chain_config(self, i, h)
        delta = None
        if chain is not None and folds_o(self, i, h):
            heads = self._attention_heads(i, h, ctx, cos, sin, x)
            done = chained_moe_layer(self, i, h, chain, heads=heads)
            if done is not None:
                return done
            delta = linear(heads, self.attention[i].o)
        if delta is None:
            delta = self.mixer(i, h, ctx, cos, sin, x)
        if chain is not None:
            done = chained_moe_layer(self, i, h, chain, delta=delta)
            if done is not None:
                return done
        # An MoE layer's add + norm, router and top-k in one launch where the kernel takes them.
        dp4a_experts = w.router is not None and dp4a_step.resident_stack(self, i) is not None  # codes beside x
        routed = None if w.router is None else add_norm_route(h, delta, w.norm, w.router, c.rms_eps,
                                                               c.n_experts_used, c.norm_topk_prob,
                                                               quantize=dp4a_experts)
        if routed is None:
            h, x = add_rms_norm(h, delta, w.norm, c.rms_eps, quantize=dp4a_experts)
            if w.router is None:  # a dense FFN
                return add_rms_norm(h, self._feed_forward(i, x), self.norm_after(i), c.rms_eps)
            routing = None
        else:
            h, x, weights, ids = routed
            routing = (weights, ids)
        return self.join_add_norm(i, h, *self._feed_forward(i, x, routing=routing, joined=False), x)

    def forward(self, ids: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """ids: [T] -> logits float32 [T, vocab] (or [1, vocab] for the last token unless ctx.want_all_logits)."""
        h, cos, sin = self.begin(ids, ctx)
        x = rms_norm(h, self.mixer_norm(0), self.config.rms_eps, quantize=dp4a_step.reads_qkv(self, 0))
        for i in range(self.n_main_layers):
            h, x = self.layer(i, h, x, ctx, cos, sin)
        return self.head(h, ctx, x)

    def head(self, h: torch.Tensor, ctx: ForwardContext, normed: torch.Tensor | None = None) -> torch.Tensor:
        """End of a step: experts adapt, then logits of the last token (or of all, if the context asks)."""
        self.experts.end_step()
        return self.logits(h, ctx) if normed is None else self.logits(h, ctx, normed)

    def logits(self, h: torch.Tensor, ctx: ForwardContext, normed: torch.Tensor | None = None) -> torch.Tensor:
        """`normed`: h already through the output norm (`layer` did it with the last residual add)."""
        if ctx.want_hidden or normed is not None:
            # Speculative decoding drafts from the final normed hidden states.
            normed = rms_norm(h, self.output_norm, self.config.rms_eps) if normed is None else normed
            if ctx.want_hidden:
                ctx.hidden = normed
            return linear(normed if ctx.want_all_logits else normed[-1:], self.output).float()
        if not ctx.want_all_logits:
            h = h[-1:]
        return linear(rms_norm(h, self.output_norm, self.config.rms_eps), self.output).float()
