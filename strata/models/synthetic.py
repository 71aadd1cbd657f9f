"""`strata make-model`: valid GGUF models with synthetic weights and a real small BPE tokenizer, at named shapes."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from strata.errors import StrataError
from strata.gguf.writer import TensorSpec, write_gguf


@dataclass(frozen=True)
class Shape:
    n_layers: int
    n_embd: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int
    n_ff: int = 0  # dense archs
    n_experts: int = 0  # MoE archs
    n_experts_used: int = 0
    expert_ff: int = 0
    shared_expert_ff: int = 0
    context_length: int = 4096
    expert_quant: str | None = None  # expert tensors' type when it differs from --quant
    # qwen3next's GatedDeltaNet (0: derived from the attention shape by qwen3next_shape)
    ssm_k_heads: int = 0
    ssm_v_heads: int = 0
    ssm_head_dim: int = 0
    full_attention_interval: int = 0
    nextn_layers: int = 0  # qwen3next: MTP blocks after the trunk (blk.{n_layers}.nextn.*), for speculative decoding


PRESETS: dict[str, Shape] = {
    "tiny": Shape(n_layers=2, n_embd=64, n_heads=4, n_kv_heads=2, head_dim=16, vocab=512,
                  n_ff=128, n_experts=8, n_experts_used=2, expert_ff=32),
    "small": Shape(n_layers=8, n_embd=512, n_heads=8, n_kv_heads=2, head_dim=64, vocab=4096,
                   n_ff=1536, n_experts=32, n_experts_used=4, expert_ff=256),
    # Full-size shapes, for benchmarks on the GPU machine (the peers' figures are taken on these).
    "qwen3-30b-a3b": Shape(n_layers=48, n_embd=2048, n_heads=32, n_kv_heads=4, head_dim=128, vocab=151936,
                           n_experts=128, n_experts_used=8, expert_ff=768, context_length=40960),
    # Strata's qwen4exp experts (2560 x 640, 512 of them, top 10, a shared expert) behind plain attention.
    "qwen4exp-experts": Shape(n_layers=48, n_embd=2560, n_heads=24, n_kv_heads=2, head_dim=256, vocab=248320,
                              n_experts=512, n_experts_used=10, expert_ff=640, shared_expert_ff=640,
                              context_length=262144, expert_quant="Q2_0"),
}
# `--preset full`: the architecture's real shapes (qwen4exp's are in synthetic_qwen4exp.py).
FULL_PRESETS: dict[str, Shape] = {
    # Qwen3-Next-80B-A3B: GatedDeltaNet 16 k / 32 v heads of 128, gated attention every 4th layer.
    "qwen3next": Shape(n_layers=48, n_embd=2048, n_heads=16, n_kv_heads=2, head_dim=256, vocab=151936,
                       n_experts=512, n_experts_used=10, expert_ff=512, shared_expert_ff=512, context_length=262144,
                       expert_quant="Q4_K", ssm_k_heads=16, ssm_v_heads=32, ssm_head_dim=128,
                       full_attention_interval=4),
}
ARCHS = ("qwen2", "qwen3", "qwen3moe", "qwen3next", "qwen4exp")
WEIGHT_SCALE = 0.02


def _normal(rng: np.random.Generator, shape, scale: float) -> np.ndarray:
    return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float32)


def _matrix(name: str, shape: tuple[int, ...], quant: str, seed: int, scale: float = WEIGHT_SCALE) -> TensorSpec:
    from strata.quant import get_format, random_blocks

    fmt = get_format(quant)
    rng_seed = [seed, *name.encode()]

    def make() -> np.ndarray:
        rng = np.random.default_rng(rng_seed)
        if fmt.name in ("F32", "F16", "BF16"):
            from strata.quant import quantize

            return quantize(_normal(rng, shape, scale), fmt.name)
        n_blocks = int(np.prod(shape)) // fmt.block_size
        return random_blocks(fmt.name, n_blocks, rng, scale)

    if shape[-1] % fmt.block_size:
        raise StrataError(f"{name}: rows of {shape[-1]} weights are not a multiple of {fmt.name}'s block of {fmt.block_size}")
    return TensorSpec(name, shape, fmt.ggml_type, make)


def gated_attention_specs(p: str, s, quant: str, seed: int) -> list[TensorSpec]:
    """A gated attention layer's tensors (Qwen3-Next's, and qwen4exp's QSA layers): `s` has n_embd, n_heads,
    n_kv_heads and head_dim."""
    q_dim, kv_dim = s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim
    return [
        _matrix(p + "attn_q.weight", (2 * q_dim, s.n_embd), quant, seed),  # per head: query, then output gate
        _matrix(p + "attn_k.weight", (kv_dim, s.n_embd), quant, seed),
        _matrix(p + "attn_v.weight", (kv_dim, s.n_embd), quant, seed),
        _matrix(p + "attn_output.weight", (s.n_embd, q_dim), quant, seed),
        _vector(p + "attn_q_norm.weight", s.head_dim, 1.0),
        _vector(p + "attn_k_norm.weight", s.head_dim, 1.0),
    ]


def _vector(name: str, n: int, value: float | None = None, seed: int = 0, scale: float = 0.1) -> TensorSpec:
    def make() -> np.ndarray:
        if value is not None:
            return np.full(n, value, dtype=np.float32)
        return _normal(np.random.default_rng([seed, *name.encode()]), n, scale)

    return TensorSpec(name, (n,), 0, make)


def qwen3next_shape(s: Shape) -> Shape:
    """Fill the GatedDeltaNet fields left 0: v heads as many as query heads, half as many k heads, full attention
    every 4th layer (every 2nd in a model of fewer than 4 layers), a shared expert as wide as a routed one."""
    return replace(
        s,
        ssm_v_heads=s.ssm_v_heads or s.n_heads,
        ssm_k_heads=s.ssm_k_heads or max(1, (s.ssm_v_heads or s.n_heads) // 2),
        ssm_head_dim=s.ssm_head_dim or s.head_dim,
        full_attention_interval=s.full_attention_interval or min(4, max(2, s.n_layers)),
        shared_expert_ff=s.shared_expert_ff or s.expert_ff,
    )


def _qwen3next_layer(p: str, i: int, s: Shape, quant: str, seed: int) -> list[TensorSpec]:
    """A GatedDeltaNet or gated-attention mixer with llama.cpp's qwen3next names (norms already carry the +1)."""
    out = [_vector(p + "attn_norm.weight", s.n_embd, 1.0), _vector(p + "post_attention_norm.weight", s.n_embd, 1.0)]
    if (i + 1) % s.full_attention_interval == 0 or i >= s.n_layers:  # MTP blocks are attention layers
        return out + gated_attention_specs(p, s, quant, seed)
    nv, d = s.ssm_v_heads, s.ssm_head_dim
    channels = (2 * s.ssm_k_heads + nv) * d
    conv = _normal(np.random.default_rng([seed, *(p + "conv").encode()]), (channels, 4), 0.5)
    return out + [
        _matrix(p + "attn_qkv.weight", (channels, s.n_embd), quant, seed),
        _matrix(p + "attn_gate.weight", (nv * d, s.n_embd), quant, seed),
        _matrix(p + "ssm_ba.weight", (2 * nv, s.n_embd), quant, seed),
        TensorSpec(p + "ssm_conv1d.weight", (channels, 4), 0, lambda: conv),
        _vector(p + "ssm_dt.bias", nv, 0.0),
        _vector(p + "ssm_a", nv, -0.1),  # A = -exp(A_log): a slow decay
        _vector(p + "ssm_norm.weight", d, 1.0),
        _matrix(p + "ssm_out.weight", (s.n_embd, nv * d), quant, seed),
    ]


def model_tensors(arch: str, s: Shape, quant: str, seed: int) -> list[TensorSpec]:
    expert_quant = s.expert_quant or quant
    q_dim, kv_dim = s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim
    out = [_matrix("token_embd.weight", (s.vocab, s.n_embd), quant, seed), _vector("output_norm.weight", s.n_embd, 1.0)]
    for i in range(s.n_layers):
        p = f"blk.{i}."
        if arch == "qwen3next":
            out += _qwen3next_layer(p, i, s, quant, seed) + _moe_tensors(p, s, expert_quant, seed)
            continue
        out += [
            _vector(p + "attn_norm.weight", s.n_embd, 1.0),
            _matrix(p + "attn_q.weight", (q_dim, s.n_embd), quant, seed),
            _matrix(p + "attn_k.weight", (kv_dim, s.n_embd), quant, seed),
            _matrix(p + "attn_v.weight", (kv_dim, s.n_embd), quant, seed),
            _matrix(p + "attn_output.weight", (s.n_embd, q_dim), quant, seed),
            _vector(p + "ffn_norm.weight", s.n_embd, 1.0),
        ]
        if arch == "qwen2":
            out += [_vector(p + f"attn_{x}.bias", d, seed=seed) for x, d in (("q", q_dim), ("k", kv_dim), ("v", kv_dim))]
        else:
            out += [_vector(p + "attn_q_norm.weight", s.head_dim, 1.0), _vector(p + "attn_k_norm.weight", s.head_dim, 1.0)]
        if arch == "qwen3moe":
            out += _moe_tensors(p, s, expert_quant, seed)
        else:
            out += [
                _matrix(p + "ffn_gate.weight", (s.n_ff, s.n_embd), quant, seed),
                _matrix(p + "ffn_up.weight", (s.n_ff, s.n_embd), quant, seed),
                _matrix(p + "ffn_down.weight", (s.n_embd, s.n_ff), quant, seed),
            ]
    if arch == "qwen3next":
        for i in range(s.n_layers, s.n_layers + s.nextn_layers):
            p = f"blk.{i}."
            out += _qwen3next_layer(p, i, s, quant, seed) + _moe_tensors(p, s, expert_quant, seed) + [
                _matrix(p + "nextn.eh_proj.weight", (s.n_embd, 2 * s.n_embd), quant, seed),
                _vector(p + "nextn.enorm.weight", s.n_embd, 1.0),
                _vector(p + "nextn.hnorm.weight", s.n_embd, 1.0),
                _vector(p + "nextn.shared_head_norm.weight", s.n_embd, 1.0),
            ]
    out.append(_matrix("output.weight", (s.vocab, s.n_embd), quant, seed))
    return out


def _moe_tensors(p: str, s: Shape, expert_quant: str, seed: int) -> list[TensorSpec]:
    e, ff = s.n_experts, s.expert_ff
    out = [
        # Routers stay F32 as llama.cpp keeps them; N(0, 0.02) gives a realistic spread of choices.
        TensorSpec(p + "ffn_gate_inp.weight", (e, s.n_embd), 0,
                   lambda n=p: _normal(np.random.default_rng([seed, *n.encode()]), (e, s.n_embd), WEIGHT_SCALE)),
        _matrix(p + "ffn_gate_exps.weight", (e, ff, s.n_embd), expert_quant, seed),
        _matrix(p + "ffn_up_exps.weight", (e, ff, s.n_embd), expert_quant, seed),
        _matrix(p + "ffn_down_exps.weight", (e, s.n_embd, ff), expert_quant, seed),
    ]
    if s.shared_expert_ff:
        sff = s.shared_expert_ff
        out += [
            _vector(p + "ffn_gate_inp_shexp.weight", s.n_embd, seed=seed, scale=WEIGHT_SCALE),
            _matrix(p + "ffn_gate_shexp.weight", (sff, s.n_embd), expert_quant, seed),
            _matrix(p + "ffn_up_shexp.weight", (sff, s.n_embd), expert_quant, seed),
            _matrix(p + "ffn_down_shexp.weight", (s.n_embd, sff), expert_quant, seed),
        ]
    return out


def model_metadata(arch: str, s: Shape, preset: str) -> dict:
    meta = {
        "general.name": f"strata-synthetic-{arch}-{preset}",
        f"{arch}.block_count": s.n_layers,
        f"{arch}.context_length": s.context_length,
        f"{arch}.embedding_length": s.n_embd,
        f"{arch}.attention.head_count": s.n_heads,
        f"{arch}.attention.head_count_kv": s.n_kv_heads,
        f"{arch}.attention.key_length": s.head_dim,
        f"{arch}.attention.value_length": s.head_dim,
        f"{arch}.rope.freq_base": 1_000_000.0,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-6,
    }
    if arch == "qwen3next":
        meta[f"{arch}.block_count"] = s.n_layers + s.nextn_layers
        if s.nextn_layers:
            meta[f"{arch}.nextn_predict_layers"] = s.nextn_layers
        meta |= {
            f"{arch}.rope.dimension_count": s.head_dim // 4,
            f"{arch}.ssm.conv_kernel": 4,
            f"{arch}.ssm.state_size": s.ssm_head_dim,
            f"{arch}.ssm.group_count": s.ssm_k_heads,
            f"{arch}.ssm.time_step_rank": s.ssm_v_heads,
            f"{arch}.ssm.inner_size": s.ssm_v_heads * s.ssm_head_dim,
            f"{arch}.full_attention_interval": s.full_attention_interval,
        }
    if arch in ("qwen3moe", "qwen3next"):
        meta |= {
            f"{arch}.expert_count": s.n_experts,
            f"{arch}.expert_used_count": s.n_experts_used,
            f"{arch}.expert_feed_forward_length": s.expert_ff,
        }
        if s.shared_expert_ff:
            meta[f"{arch}.expert_shared_feed_forward_length"] = s.shared_expert_ff
    else:
        meta[f"{arch}.feed_forward_length"] = s.n_ff
    return meta


def make_model(path: str | Path, arch: str = "qwen3moe", preset: str = "tiny", quant: str = "Q8_0",
               seed: int = 0, progress: bool = False, **overrides) -> Path:
    """Write a synthetic model; `overrides` replace fields of the preset's Shape (e.g. n_layers=4)."""
    from strata.tokenizer_train import train_small_bpe, write_tokenizer_metadata

    if arch not in ARCHS:
        raise StrataError(f"make-model: unknown --arch {arch} (choose from {', '.join(ARCHS)})")
    if arch == "qwen4exp":
        from strata.models.synthetic_qwen4exp import make_qwen4exp

        return make_qwen4exp(path, preset, quant, seed, progress, **overrides)
    presets = PRESETS | ({"full": FULL_PRESETS[arch]} if arch in FULL_PRESETS else {})
    if preset not in presets:
        raise StrataError(f"make-model: unknown --preset {preset} for --arch {arch} (choose from {', '.join(presets)})")
    shape = replace(presets[preset], **overrides)
    if arch == "qwen3next":
        shape = qwen3next_shape(shape)
    elif shape.nextn_layers:
        raise StrataError(f"make-model: MTP blocks (--mtp) are made for qwen3next only, not {arch}")
    tokenizer = train_small_bpe(vocab_size=shape.vocab)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    # Written beside the target and renamed at the end, so an interrupted run never leaves a truncated model.
    write_gguf(tmp, arch, model_metadata(arch, shape, preset), model_tensors(arch, shape, quant, seed),
               extra=lambda w: write_tokenizer_metadata(w, tokenizer), progress=progress)
    tmp.replace(path)
    return path
