"""ModelConfig: the shape of a model, read once from GGUF metadata and frozen."""

from __future__ import annotations

from dataclasses import dataclass, fields

from strata.errors import StrataError
from strata.gguf.reader import GGUFModelFile

# Values Strata hard-codes for qwen4exp rather than reading them (include/strata/core/layout.hpp, qsa.hpp):
# a file may carry these keys, and then they win.
ARCH_DEFAULTS = {
    "qwen4exp": {
        "attention.key_length": 256, "attention.value_length": 256, "rope.dimension_count": 64,
        "rope.freq_base": 1e7, "ssm.state_size": 128, "ssm.group_count": 16, "ssm.time_step_rank": 48,
        "ssm.inner_size": 6144, "expert_shared_feed_forward_length": 640, "context_length": 262144,
    },
}


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_layers: int
    n_embd: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    context_length: int
    rope_theta: float
    rms_eps: float
    n_ff: int = 0  # dense FFN width (0 where every layer is MoE)
    n_experts: int = 0
    n_experts_used: int = 0
    expert_ff: int = 0
    shared_expert_ff: int = 0
    norm_topk_prob: bool = True
    qkv_bias: bool = False
    qk_norm: bool = False
    tied_embeddings: bool = False
    # Hybrid (GatedDeltaNet + attention) models: llama.cpp's ssm.* keys, and which layers are recurrent.
    rope_dim: int = 0  # leading dims of each head that RoPE rotates; 0 = the whole head
    ssm_conv_kernel: int = 0
    ssm_state_size: int = 0  # key head dim
    ssm_group_count: int = 0  # key heads
    ssm_time_step_rank: int = 0  # value heads
    ssm_inner_size: int = 0  # value heads x value head dim
    recurrent_layers: tuple[bool, ...] = ()  # per layer: True for a GatedDeltaNet mixer; empty for plain decoders
    nextn_layers: int = 0  # MTP blocks at the end of the stack, counted in n_layers

    @property
    def is_hybrid(self) -> bool:
        return bool(self.recurrent_layers)

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @classmethod
    def from_gguf(cls, model: GGUFModelFile) -> "ModelConfig":
        arch = model.architecture
        arch_defaults = ARCH_DEFAULTS.get(arch, {})

        def get(key, default=..., kind=(int, float)):
            return model.field(f"{arch}.{key}", arch_defaults.get(key, default), kind)

        n_embd = get("embedding_length", kind=int)
        n_heads = get("attention.head_count", kind=int)
        n_kv = get("attention.head_count_kv", n_heads, kind=int)
        head_dim = get("attention.key_length", n_embd // n_heads if n_heads else 0, kind=int)
        if get("attention.value_length", head_dim, kind=int) != head_dim:
            raise StrataError(f"{model.path}: attention.value_length differs from key_length; not supported")
        tokens = model.metadata.get("tokenizer.ggml.tokens")
        embd = model.tensor("token_embd.weight")
        vocab = embd.shape[0]
        if tokens is not None and len(tokens) > vocab:
            raise StrataError(f"{model.path}: tokenizer has {len(tokens)} tokens but token_embd.weight has {vocab} rows")
        n_experts = get("expert_count", 0, kind=int)
        n_layers = get("block_count", kind=int)
        ssm_inner = get("ssm.inner_size", 0, kind=int)
        config = cls(
            arch=arch,
            n_layers=n_layers,
            n_embd=n_embd,
            n_heads=n_heads,
            n_kv_heads=n_kv,
            head_dim=head_dim,
            vocab_size=vocab,
            context_length=get("context_length", 4096, kind=int),
            rope_theta=float(get("rope.freq_base", 10000.0)),
            rms_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
            n_ff=get("feed_forward_length", 0, kind=int),
            n_experts=n_experts,
            n_experts_used=get("expert_used_count", 0, kind=int),
            expert_ff=get("expert_feed_forward_length", 0, kind=int),
            shared_expert_ff=get("expert_shared_feed_forward_length", 0, kind=int),
            # llama.cpp renormalises the top-k weights of qwen3moe unconditionally; files may say otherwise.
            norm_topk_prob=bool(model.metadata.get(f"{arch}.expert_weights_norm", True)),
            qkv_bias="blk.0.attn_q.bias" in model.tensors,
            qk_norm="blk.0.attn_q_norm.weight" in model.tensors,
            tied_embeddings="output.weight" not in model.tensors,
            rope_dim=get("rope.dimension_count", 0, kind=int),
            ssm_conv_kernel=get("ssm.conv_kernel", 0, kind=int),
            ssm_state_size=get("ssm.state_size", 0, kind=int),
            ssm_group_count=get("ssm.group_count", 0, kind=int),
            ssm_time_step_rank=get("ssm.time_step_rank", 0, kind=int),
            ssm_inner_size=ssm_inner,
            recurrent_layers=_recurrent_layers(model, n_layers) if ssm_inner else (),
            nextn_layers=get("nextn_predict_layers", 0, kind=int),
        )
        config.validate(str(model.path))
        return config

    def validate(self, source: str) -> None:
        for f in ("n_layers", "n_embd", "n_heads", "n_kv_heads", "head_dim", "vocab_size"):
            if getattr(self, f) <= 0:
                raise StrataError(f"{source}: {self.arch}: {f} must be positive, got {getattr(self, f)}")
        if self.n_heads % self.n_kv_heads:
            raise StrataError(f"{source}: {self.n_heads} query heads are not a multiple of {self.n_kv_heads} KV heads")
        if self.is_moe and not (0 < self.n_experts_used <= self.n_experts):
            raise StrataError(f"{source}: expert_used_count {self.n_experts_used} not in 1..{self.n_experts}")
        if not (0 <= self.rope_dim <= self.head_dim) or self.rope_dim % 2:
            raise StrataError(f"{source}: {self.arch}.rope.dimension_count {self.rope_dim} is not an even number "
                              f"of dims up to head_dim {self.head_dim}")
        if not 0 <= self.nextn_layers < self.n_layers:
            raise StrataError(f"{source}: {self.arch}.nextn_predict_layers {self.nextn_layers} leaves no main layer")
        if self.is_hybrid:
            for f in ("ssm_conv_kernel", "ssm_state_size", "ssm_group_count", "ssm_time_step_rank"):
                if getattr(self, f) <= 0:
                    key = "ssm." + f.removeprefix("ssm_")
                    raise StrataError(f"{source}: {self.arch}.{key} must be positive, got {getattr(self, f)}")
            if self.ssm_time_step_rank % self.ssm_group_count or self.ssm_inner_size % self.ssm_time_step_rank:
                raise StrataError(
                    f"{source}: {self.arch}.ssm.time_step_rank {self.ssm_time_step_rank} value heads must be a multiple "
                    f"of ssm.group_count {self.ssm_group_count} and divide ssm.inner_size {self.ssm_inner_size}")

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _recurrent_layers(model: GGUFModelFile, n_layers: int) -> tuple[bool, ...]:
    """Which layers are GatedDeltaNet, as llama.cpp reads it: the bool array attention.recurrent_layers when the
    file has one, else every layer but each full_attention_interval-th (default 4)."""
    arch = model.architecture
    key = f"{arch}.attention.recurrent_layers"
    if key in model.metadata:
        flags = model.metadata[key]
        if not isinstance(flags, (list, tuple)) or len(flags) != n_layers:
            raise StrataError(f"{model.path}: metadata field {key} must list {n_layers} layers (block_count)")
        return tuple(bool(f) for f in flags)
    interval = model.field(f"{arch}.full_attention_interval", 4, kind=int)
    if interval < 1:
        raise StrataError(f"{model.path}: metadata field {arch}.full_attention_interval must be at least 1, got {interval}")
    return tuple((i + 1) % interval != 0 for i in range(n_layers))
