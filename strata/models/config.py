"""ModelConfig: the shape of a model, read once from GGUF metadata and frozen."""

from __future__ import annotations

from dataclasses import dataclass, fields

from strata.errors import StrataError
from strata.gguf.reader import GGUFModelFile


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

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @classmethod
    def from_gguf(cls, model: GGUFModelFile) -> "ModelConfig":
        arch = model.architecture

        def get(key, default=..., kind=(int, float)):
            return model.field(f"{arch}.{key}", default, kind)

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
        config = cls(
            arch=arch,
            n_layers=get("block_count", kind=int),
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

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}
