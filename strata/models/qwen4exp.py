"""qwen4exp (Qwen3.8-Flash-Next), Strata's own model, on the tensor names and metadata keys Strata's loader reads.

Per step (Strata's src/core/layer.cpp `block_layer_pre`/`post`, src/core/session.cpp; docs/ARCHITECTURES.md):

    R = the token embedding copied into every one of hc streams                    [T, hc, embd]
    for each layer l:
        if l is the n-gram layer (ple.layers, [1]): R = ple_block(R, table rows of the last 3 tokens)
        mixed, inject = hc_read(R, hc_attn_*);  R = hc_write(R, QSA or GDN(mixed), inject)   QSA when l % 4 == 3
        mixed, inject = hc_read(R, hc_ffn_*);   R = hc_write(R, MoE(mixed), inject)
    logits = output @ hc_read(R, output_hc_*)  (no inject, no final norm)

There is no attn_norm or ffn_norm: the per-stream norm inside hc_read is the layer's input norm. MoE is
softmax-over-all, top-k renormalised, plus the shared expert times sigmoid(ffn_gate_inp_shexp . x).
With nextn_predict_layers = 1 the MTP block after the trunk is loaded, and `mtp_draft` runs it (qwen4exp_mtp.py).
"""

from __future__ import annotations

import numpy as np
import torch

from strata import switches
from strata.engine.context import ForwardContext
from strata.engine.experts import ExpertBackend, ExpertStack, ResidentExperts
from strata.engine.qwen4exp_cache import Qwen4ExpCache
from strata.engine.staging import upload
from strata.errors import StrataError
from strata.gguf.access_advice import ReadAhead, advise_random
from strata.gguf.reader import GGUFModelFile
from strata.models.config import ModelConfig
from strata.models.decoder import DecoderLM, FFNWeights, WeightLoader
from strata.models.gated_deltanet import GDNShape
from strata.models.stacked_projections import stack_projections
from strata.models.hyper_connections import HyperConnectionWeights, hc_write, hc_write_read
from strata.models.layers import Rope
from strata.models import ngram_embedding
from strata.models.ngram_embedding import (
    HISTORY_ROWS, TABLE_TENSOR, NgramHash, NgramTable, PleWeights, ple_block,
)
from strata.models.ngram_prefetch import NgramPrefetch
from strata.models.qwen4exp_mixers import (
    QSAShape, QSAWeights, Qwen4ExpGDNWeights, qsa_attention, qsa_selection, qwen4exp_gdn,
)
from strata.models.qwen4exp_mtp import MTPWeights, mtp_input
from strata.models.weights import QuantWeight, linear

GDN_TENSORS = ("attn_qkv.weight", "attn_gate.weight", "ssm_alpha.weight", "ssm_beta.weight", "ssm_conv1d.weight",
               "ssm_a", "ssm_dt.bias", "ssm_norm.weight", "ssm_out.weight")
QSA_TENSORS = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "indexer.q_proj.weight",
               "indexer.k_proj.weight")


class Qwen4ExpLM(DecoderLM):
    """Token ids in, logits out; every per-sequence state lives in the Qwen4ExpCache of new_cache()."""

    dp4a_wired = False  # STRATA_DP4A: not wired yet (its own attention and norms; models/dp4a_step.py)

    def __init__(self, config: ModelConfig, model: GGUFModelFile, device: torch.device, dtype: torch.dtype,
                 experts: ExpertBackend | None = None, progress: bool = False, expert_device: torch.device | None = None):
        self.config, self.device, self.dtype = config, device, dtype
        self.expert_device = expert_device
        self.source = str(model.path)
        c, arch = config, config.arch
        if not c.is_hybrid or not c.is_moe:
            raise StrataError(f"{model.path}: {arch} needs ssm.* and expert_count metadata")

        def meta(key: str, default: int) -> int:
            return model.field(f"{arch}.{key}", default, int)

        self.hc = meta("hyper_connection.count", 4)
        self.hc_rank = meta("hyper_connection.low_rank", 320)  # Strata hard-codes 320
        self.qsa = QSAShape(n_heads=c.n_heads, n_kv_heads=c.n_kv_heads, head_dim=c.head_dim,
                            n_rot=c.rope_dim or c.head_dim, rope_base=c.rope_theta,
                            indexer_heads=meta("attention.indexer.head_count", 4),
                            indexer_dim=meta("attention.indexer.key_length", 128),
                            top_k=indexer_top_k(model, arch))
        self.gdn = GDNShape(n_k_heads=c.ssm_group_count, n_v_heads=c.ssm_time_step_rank, k_dim=c.ssm_state_size,
                            v_dim=c.ssm_inner_size // c.ssm_time_step_rank, conv_kernel=c.ssm_conv_kernel)
        self.n_main = c.n_layers - c.nextn_layers
        self.recurrent = c.recurrent_layers[: self.n_main]
        if c.nextn_layers > 1:
            raise StrataError(f"{model.path}: {arch}.nextn_predict_layers is {c.nextn_layers}; qwen4exp has one MTP block")
        self._check_layers(model)
        self.ple_layer = self._ple_layer(model)
        self.ngram_hash = NgramHash.from_gguf(model, arch)
        self.ngram_table = self._load_table(model)  # checked before the weights load: the table shard is the one apart
        self.ngram_prefetch = NgramPrefetch(self._lookup_rows, c.n_embd, device, source=self.source)
        load = WeightLoader(model, device, dtype, progress)
        width = self.hc * c.n_embd
        self.embed = load.quant("token_embd.weight", c.vocab_size, c.n_embd)
        self.output = self.embed if c.tied_embeddings else load.quant("output.weight", c.vocab_size, c.n_embd)
        self.hc_output = self._load_hc(load, "output_hc_", inject=False)
        self.hc_attn: list[HyperConnectionWeights] = []
        self.hc_ffn: list[HyperConnectionWeights] = []
        self.mixers: list[Qwen4ExpGDNWeights | QSAWeights] = []
        self.ffn: list[FFNWeights] = []
        stacks: dict[int, ExpertStack] = {}
        for i in range(self.n_main):
            p = f"blk.{i}."
            self.hc_attn.append(self._load_hc(load, p + "hc_attn_"))
            self.hc_ffn.append(self._load_hc(load, p + "hc_ffn_"))
            self.mixers.append(self._load_gdn(load, p) if self.recurrent[i] else self._load_qsa(load, p))
            self.ffn.append(self._load_moe(load, p, i, stacks))
        self.mtp = self._load_mtp(load, self.n_main, stacks) if c.nextn_layers else None
        self.ple = self._load_ple(load, f"blk.{self.ple_layer}.", width)
        self.experts = experts if experts is not None else ResidentExperts(stacks)
        self.expert_stacks = stacks
        self.rope = Rope(self.qsa.n_rot, c.rope_theta, device)
        load.bar.close()

    # ------------------------------------------------------------------------------------------ loading

    def _check_layers(self, model: GGUFModelFile) -> None:
        """Each layer's tensors must be those of the mixer the layer pattern gives it."""
        key = f"{self.config.arch}.full_attention_interval"
        for i, recurrent in enumerate(self.recurrent):
            for name in QSA_TENSORS if recurrent else GDN_TENSORS:
                if f"blk.{i}.{name}" in model.tensors:
                    kind = "a GatedDeltaNet" if recurrent else "a QSA attention"
                    raise StrataError(f"{model.path}: tensor blk.{i}.{name} does not belong in layer {i}, which is "
                                      f"{kind} layer by {key}={model.metadata.get(key, 4)!r}")

    def _ple_layer(self, model: GGUFModelFile) -> int:
        key = f"{self.config.arch}.ple.layers"
        layers = list(model.metadata.get(key, [1]))
        if len(layers) != 1 or not 0 <= int(layers[0]) < self.n_main:
            raise StrataError(f"{model.path}: metadata field {key} must name one layer below {self.n_main}, got {layers}")
        return int(layers[0])

    def _load_hc(self, load: WeightLoader, p: str, inject: bool = True) -> HyperConnectionWeights:
        width = self.hc * self.config.n_embd
        return HyperConnectionWeights(
            norm=load.quant(p + "norm.weight", width).dequantize(torch.float32).to(self.device),
            down=load.quant(p + "down.weight", self.hc_rank, width),
            up=load.quant(p + "up.weight", width, self.hc_rank),
            inject=load.quant(p + "inject.weight", self.hc, width) if inject else None,
        )

    def _load_gdn(self, load: WeightLoader, p: str) -> Qwen4ExpGDNWeights:
        c, s = self.config, self.gdn
        value_dim = s.n_v_heads * s.v_dim
        # A decode step on the GPU reads qkv, gate (and beta, alpha) through one matvec: one block tensor, views.
        inputs, parts, (qkv, gate, beta, alpha) = stack_projections(
            p + "gdn_inputs", (load.quant(p + "attn_qkv.weight", s.conv_channels, c.n_embd),
                               load.quant(p + "attn_gate.weight", value_dim, c.n_embd),
                               load.quant(p + "ssm_beta.weight", s.n_v_heads, c.n_embd),
                               load.quant(p + "ssm_alpha.weight", s.n_v_heads, c.n_embd)), (4, 2))
        return Qwen4ExpGDNWeights(
            qkv=qkv,
            gate=gate,
            alpha=alpha,
            beta=beta,
            conv=load.dense(p + "ssm_conv1d.weight", s.conv_channels, s.conv_kernel),
            dt_bias=load.dense(p + "ssm_dt.bias", s.n_v_heads),
            decay_rate=load.quant(p + "ssm_a", s.n_v_heads).dequantize(torch.float32).to(self.device),
            out_norm=load.dense(p + "ssm_norm.weight", s.v_dim),
            out=load.quant(p + "ssm_out.weight", c.n_embd, value_dim),
            inputs=inputs,
            inputs_parts=parts,
        )

    def _load_qsa(self, load: WeightLoader, p: str, indexer: bool = True) -> QSAWeights:
        c, s = self.config, self.qsa
        q_dim, kv_dim = s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim
        w = QSAWeights(
            q=load.quant(p + "attn_q.weight", 2 * q_dim, c.n_embd),
            k=load.quant(p + "attn_k.weight", kv_dim, c.n_embd),
            v=load.quant(p + "attn_v.weight", kv_dim, c.n_embd),
            o=load.quant(p + "attn_output.weight", c.n_embd, q_dim),
            q_norm=load.dense(p + "attn_q_norm.weight", s.head_dim),
            k_norm=load.dense(p + "attn_k_norm.weight", s.head_dim),
        )
        if indexer:
            w.indexer_q = load.quant(p + "indexer.q_proj.weight", s.indexer_heads * s.indexer_dim, c.n_embd)
            w.indexer_k = load.quant(p + "indexer.k_proj.weight", s.indexer_dim, c.n_embd)
            w.indexer_q_norm = load.dense(p + "indexer.q_norm.weight", s.indexer_dim)
            w.indexer_k_norm = load.quant(p + "indexer.k_norm.weight", s.indexer_dim).dequantize().to(self.device)
        return w

    def _load_mtp(self, load: WeightLoader, layer: int, stacks: dict[int, ExpertStack]) -> MTPWeights:
        """The MTP block's attention and MoE go into the per-layer lists at index n_main, after the trunk's."""
        c, p = self.config, f"blk.{layer}."
        self.hc_attn.append(self._load_hc(load, p + "hc_attn_"))
        self.hc_ffn.append(self._load_hc(load, p + "hc_ffn_"))
        self.mixers.append(self._load_qsa(load, p, indexer=False))
        self.ffn.append(self._load_moe(load, p, layer, stacks))
        return MTPWeights(
            fc_embedding=load.quant(p + "nextn.fc_embedding.weight", c.n_embd, c.n_embd),
            fc_hidden=load.quant(p + "nextn.fc_hidden.weight", c.n_embd, c.n_embd),
            norm_embedding=load.dense(p + "nextn.norm_embedding.weight", c.n_embd),
            norm_hidden=load.quant(p + "nextn.norm_hidden.weight", self.hc * c.n_embd).dequantize().to(self.device),
            hc_out=self._load_hc(load, p + "nextn.hc_out_", inject=False),
        )

    def _load_moe(self, load: WeightLoader, p: str, layer: int, stacks: dict[int, ExpertStack]) -> FFNWeights:
        c, sff, on = self.config, self.config.shared_expert_ff, self.expert_device
        stacks[layer] = ExpertStack(
            gate=load.quant(p + "ffn_gate_exps.weight", c.n_experts, c.expert_ff, c.n_embd, device=on),
            up=load.quant(p + "ffn_up_exps.weight", c.n_experts, c.expert_ff, c.n_embd, device=on),
            down=load.quant(p + "ffn_down_exps.weight", c.n_experts, c.n_embd, c.expert_ff, device=on),
        )
        return FFNWeights(
            norm=None,
            router=load.quant(p + "ffn_gate_inp.weight", c.n_experts, c.n_embd),
            shared_gate=load.quant(p + "ffn_gate_shexp.weight", sff, c.n_embd),
            shared_up=load.quant(p + "ffn_up_shexp.weight", sff, c.n_embd),
            shared_down=load.quant(p + "ffn_down_shexp.weight", c.n_embd, sff),
            shared_router=load.dense(p + "ffn_gate_inp_shexp.weight", c.n_embd),
        )

    def _load_ple(self, load: WeightLoader, p: str, width: int) -> PleWeights:
        embd = self.config.n_embd
        dense32 = lambda name, *shape: load.quant(p + name, *shape).dequantize(torch.float32).to(self.device)  # noqa: E731
        return PleWeights(
            key=load.quant(p + "ple_key.weight", width, embd),
            value=load.quant(p + "ple_value.weight", embd, embd),
            norm_key=dense32("ple_norm_key.weight", width),
            norm_query=dense32("ple_norm_query.weight", width),
            norm_conv=dense32("ple_norm_conv.weight", width),
            conv=dense32("ple_conv1d.weight", width, 4),
        )

    def _load_table(self, model: GGUFModelFile) -> NgramTable:
        """The n-gram table stays in its memory-mapped shard (on the host); rows are gathered as tokens need them."""
        info = model.tensors.get(TABLE_TENSOR)
        if info is None:
            raise StrataError(f"{model.path}: tensor {TABLE_TENSOR} (the n-gram table, kept in its own shard) is "
                              f"missing: give the first shard of the split GGUF with every shard beside it")
        head_dim = self.config.n_embd // self.ngram_hash.n_heads
        rows = self.ngram_hash.n_rows
        # The real table has a few more rows than the heads address (320,001,536 for 320,001,446: padded to 256).
        if len(info.shape) != 2 or info.shape[1] != head_dim or info.shape[0] < rows:
            raise StrataError(f"{info.file}: tensor {TABLE_TENSOR} has shape {list(info.shape)}, expected at least "
                              f"{[rows, head_dim]} (the heads' vocab sizes sum to {rows:,} rows)")
        advise_random(info.data)  # its rows are read at random: a fault reads its own page, not 32 (access_advice.py)
        return NgramTable(QuantWeight.from_info(info, "cpu"), read_ahead=ReadAhead.of(info.data, info.file))

    # ------------------------------------------------------------------------------------------ running

    def new_cache(self, max_tokens: int, kv_dtype: str | torch.dtype) -> Qwen4ExpCache:
        c, s = self.config, self.qsa
        return Qwen4ExpCache(self.recurrent, c.n_kv_heads, c.head_dim, self.gdn.conv_state_shape,
                             self.gdn.state_shape, max_tokens, kv_dtype, self.dtype, self.device,
                             indexer_key_dim=s.indexer_dim, indexer_rot=s.n_rot, rope_base=s.rope_base,
                             eps=c.rms_eps, ple_width=self.hc * c.n_embd, ple_history_rows=HISTORY_ROWS,
                             mtp_layers=int(self.mtp is not None))

    def prompt_mask_context(self, n_ctx: int, cache: Qwen4ExpCache) -> int:
        """The widest [chunk, context] mask a prompt chunk's attention builds (engine/prefill.py's chunk rule): past
        `selection_cells` every trunk QSA layer selects, and over a dense fp16 cache the selected-cells kernel takes
        no mask (KVCache.selected_kernel); below, the dense attention's mask is at most that wide. Else the whole
        context (a layer without an indexer, SDPA's masked path)."""
        c = self.config
        probe = torch.empty(0, c.n_heads, c.head_dim, device=self.device)
        select = getattr(cache.kv, "selected_kernel", None)
        indexed = all(self.mixers[i].indexer_q is not None for i in range(self.n_main) if not self.recurrent[i])
        if indexed and select is not None and select(probe):
            return min(n_ctx, self.qsa.selection_cells)
        return n_ctx

    def ngram_rows(self, tokens: np.ndarray, cache: Qwen4ExpCache) -> torch.Tensor:
        """The n-gram table's rows (float32 [T, embd], on the host) of tokens [T] following the cache's last two;
        the cache moves its token window past them."""
        rows = self.ngram_hash.rows(tokens, cache.previous_tokens)
        self._move_token_window(tokens, cache)
        return self.ngram_table.gather(rows)

    @staticmethod
    def _move_token_window(tokens: np.ndarray, cache: Qwen4ExpCache) -> None:
        """The cache's (2 back, 1 back) past tokens [T]."""
        window = (*cache.previous_tokens, *(int(t) for t in tokens[-2:]))
        cache.previous_tokens = (window[-2], window[-1])

    def _lookup_rows(self, tokens: np.ndarray, previous: tuple[int, int], out: torch.Tensor) -> None:
        """The prefetch thread's lookup: rows of tokens after `previous` into out, the row cache untouched."""
        self.ngram_table.gather_into(self.ngram_hash.rows(tokens, previous), out)

    def begin_prompt(self, tokens: list[int], bounds: list[tuple[int, int]], start: int,
                     cache: Qwen4ExpCache) -> None:
        """The engine is about to read `tokens` from position `start` in the chunks [begin, end) of `bounds`: their
        n-gram rows are gathered ahead on a host thread (models/ngram_prefetch.py), unless STRATA_NGRAM_SYNC. Only
        chunks too large for the row cache: smaller ones stay in line, through it (decode steps reuse its rows)."""
        if not switches.get("STRATA_NGRAM_SYNC"):
            uncached = ngram_embedding.CACHED_GATHER_ROWS // self.ngram_hash.n_heads + 1
            previous = (-1, -1) if start == 0 else cache.previous_tokens  # a forward at 0 starts the cache over
            self.ngram_prefetch.begin(tokens, bounds, start, previous, min_tokens=uncached)

    def end_prompt(self) -> None:
        """The prompt is read (or stopped): rows gathered ahead and not taken are dropped."""
        self.ngram_prefetch.end()

    def _ngram_block(self, ids: torch.Tensor, residual: torch.Tensor, cache: Qwen4ExpCache,
                     ctx: ForwardContext) -> torch.Tensor:
        """The n-gram block at its layer. Without a host wait (unless STRATA_NGRAM_SYNC, the previous form): the
        tokens from the caller's host copy (a device read waits for every launch queued before it), the rows from
        the prefetch thread or in line, copied from pinned memory behind the queued work."""
        in_line = switches.get("STRATA_NGRAM_SYNC")
        tokens = ids.cpu().numpy() if ctx.tokens is None or in_line else np.asarray(ctx.tokens, dtype=np.int64)
        if ctx.keep_row_states:  # a verify window: what keep_rows needs to put the token window and conv history back
            cache.mark_window([int(t) for t in tokens])
        emb = self.ngram_prefetch.take(ctx.start, tokens, cache.previous_tokens)
        if emb is not None:
            self._move_token_window(tokens, cache)
            emb = emb.to(self.device, non_blocking=True)  # pinned by the prefetch thread
        elif in_line:
            emb = self.ngram_rows(tokens, cache).to(self.device)
        else:
            emb = upload(self.ngram_rows(tokens, cache), self.device)
        residual, history = ple_block(residual, emb, self.ple, cache.ple_history, self.config.rms_eps)
        cache.ple_history.copy_(history)
        return residual

    def forward(self, ids: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """ids: [T] -> logits float32 [T, vocab] (or [1, vocab] for the last token unless ctx.want_all_logits);
        with ctx.want_hidden, ctx.hidden is the final residual stack [T, hc, embd] (what the MTP block reads)."""
        residual = self.forward_residual(ids, ctx)
        if ctx.want_hidden:
            ctx.hidden = residual
        return self.head(residual, ctx)

    def forward_residual(self, ids: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """ids: [T] -> the final residual stack [T, hc, embd] (float32), before the head."""
        cache, c = ctx.kv, self.config
        if not isinstance(cache, Qwen4ExpCache):
            raise StrataError(f"{self.source}: {c.arch} needs the Qwen4ExpCache of new_cache(), "
                              f"got {type(cache).__name__}")
        cache.check(self.source, self.recurrent, self.gdn.conv_state_shape, self.gdn.state_shape)
        cache.check_ple(self.source, (HISTORY_ROWS, self.hc * c.n_embd))
        cache.begin(ctx.start, ctx.n_tokens)
        positions = ctx.positions(self.device)
        cos, sin = self.rope.cos_sin(positions, self.dtype)
        # The residual stack is kept in float32 whatever the compute dtype (Strata's R is float32).
        residual = self.embed_tokens(ids).float()[:, None, :].repeat(1, self.hc, 1)
        pending = None  # each half-layer's write, folded into the next read (hc_write_read)
        for i in range(self.n_main):
            if i == self.ple_layer:
                residual = self._ngram_block(ids, hc_write(residual, *pending) if pending else residual, cache, ctx)
                pending = None
            residual, x, inject = hc_write_read(residual, self.hc_attn[i], c.rms_eps, pending, self.dtype)
            if self.recurrent[i]:
                y, conv, state = qwen4exp_gdn(self.mixers[i], self.gdn, x, cache.conv[i], cache.state[i], c.rms_eps,
                                              ctx.keep_row_states)
                if ctx.keep_row_states:
                    cache.keep_row_states(i, conv, state)
                else:
                    if conv is not cache.conv[i]:  # the decode-step kernel wrote it in place
                        cache.conv[i].copy_(conv)
                    cache.state[i].copy_(state)
            else:
                selection = qsa_selection(self.mixers[i], self.qsa, x, ctx.start, positions, cache.indexer[i],
                                          c.rms_eps)
                y = qsa_attention(self.mixers[i], self.qsa, x, cache, i, ctx.start, cos, sin, selection, c.rms_eps,
                                  ctx.keep_row_states)
            residual, x, inject = hc_write_read(residual, self.hc_ffn[i], c.rms_eps, (y, inject), self.dtype)
            pending = (self._feed_forward(i, x), inject)
        return hc_write(residual, *pending) if pending else residual

    def mtp_draft(self, residual: torch.Tensor, next_ids: torch.Tensor, cache: Qwen4ExpCache,
                  start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """MTP over cells start..start+T-1: cell i pairs the trunk's final stack R_i (`residual` [T, hc, embd]) with
        the token at i+1 (`next_ids` [T]); returns (logits float32 [T, vocab] for the tokens at i+2, the block's
        stack [T, hc, embd], the input of a next draft step). Keys and values go to the cache's MTP layer."""
        return self.mtp_forward(residual, next_ids, cache.mtp_kv, start)

    def mtp_cache(self, cache: Qwen4ExpCache):
        """Where speculative decoding keeps the MTP block's keys: the sequence cache's own MTP layer."""
        return cache.mtp_kv

    def mtp_forward(self, residual: torch.Tensor, next_ids: torch.Tensor, kv,
                    start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """mtp_draft with the MTP layer's KV backend given (engine/spec.py's interface, as Qwen3-Next's)."""
        if self.mtp is None:
            raise StrataError(f"{self.source}: this model has no MTP block (nextn_predict_layers is 0)")
        kv.reserve(start + residual.shape[0])
        return self.mtp_step(residual, next_ids, ForwardContext(kv, start, residual.shape[0]))

    @property
    def mtp_hidden(self) -> tuple[tuple[int, ...], torch.dtype]:
        """(shape, dtype) of the hidden state a draft reads: the trunk's final residual stack, float32."""
        return (self.hc, self.config.n_embd), torch.float32

    def mtp_step(self, residual: torch.Tensor, next_ids: torch.Tensor,
                 ctx: ForwardContext) -> tuple[torch.Tensor, torch.Tensor]:
        """`mtp_forward`'s work over a context the caller set up (its MTP cache reserved): the eager step's, or a
        static one whose positions are a device tensor (engine/spec_mtp.py captures it)."""
        layer, eps = self.n_main, self.config.rms_eps
        cos, sin = self.rope.cos_sin(ctx.positions(self.device), self.dtype)
        stack = mtp_input(self.mtp, residual, self.embed_tokens(next_ids), eps)
        stack, x, inject = hc_write_read(stack, self.hc_attn[layer], eps, None, self.dtype)
        y = qsa_attention(self.mixers[layer], self.qsa, x, ctx.kv, 0, ctx.start, cos, sin, None, eps)
        stack, x, inject = hc_write_read(stack, self.hc_ffn[layer], eps, (y, inject), self.dtype)
        stack, x, _ = hc_write_read(stack, self.mtp.hc_out, eps, (self._feed_forward(layer, x), inject), self.dtype)
        return linear(x, self.output).float(), stack

    def logits(self, residual: torch.Tensor, ctx: ForwardContext,
               pending: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Logits float32 of the final residual stack [T, hc, embd] (its last row unless ctx.want_all_logits), after
        the last write (y, inject) if it is still pending; the inherited `head` lets the experts adapt first."""
        if not ctx.want_all_logits:
            residual = residual[-1:]
            pending = tuple(t[-1:] for t in pending) if pending else None
        return self.final_read(residual, pending)[1]

    def final_read(self, residual: torch.Tensor, pending: tuple[torch.Tensor, torch.Tensor] | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the final residual stack after the pending write, the logits float32 of its rows): the head's read, the
        stack being what the MTP block drafts from."""
        residual, x, _ = hc_write_read(residual, self.hc_output, self.config.rms_eps, pending, self.dtype)
        return residual, linear(x, self.output).float()


def indexer_top_k(model: GGUFModelFile, arch: str) -> int:
    """The cells each trunk QSA query's indexer keeps (qsa.hpp's top_k; Strata's default 2,048)."""
    return model.field(f"{arch}.attention.indexer.top_k", 2048, int)


def planned_mask_context(model: GGUFModelFile, config: ModelConfig, n_ctx: int, kv_dtype: str, on_cuda: bool) -> int:
    """`Qwen4Exp.prompt_mask_context` before a model is loaded (strata info --plan's chunk rule; the engine without
    speculation): the selection's width where the selected-cells kernel will attend, else the whole context."""
    from strata.kernels.attention.prompt_dense import dense_kernel_shape

    cache_dtype = {"float16": torch.float16}.get(kv_dtype)
    if (on_cuda and cache_dtype is not None and not switches.get("STRATA_QSA_DENSE_MASK")
            and dense_kernel_shape(cache_dtype, config.head_dim, config.n_heads, config.n_kv_heads)):
        return min(n_ctx, indexer_top_k(model, config.arch) + 3)  # QSAShape.selection_cells
    return n_ctx
