"""`strata make-model --arch qwen4exp`: Strata's model with seeded random weights, written as a 2-shard GGUF whose
second shard holds only the n-gram table (as the real files keep it).

`tiny` runs in a second on the CPU (tests); `full` has the real shapes (48 layers, 24,576 Q2_0 experts of
1,382,400 bytes, about 40 GB) and is written from random quantized blocks, never from a float model. The full
table (160 x 320,001,536 IQ4_NL, 28.8 GB) is written as zeros that the file system stores as a hole: its rows
are then zero, which leaves the n-gram block's residual update finite (and small).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from strata.errors import StrataError
from strata.gguf.reader import SPLIT_NAME
from strata.gguf.writer import TensorSpec, write_gguf
from strata.models.ngram_embedding import HEAD_VOCAB_SIZES, MULTIPLIERS, TABLE_TENSOR
from strata.models.synthetic import _matrix, _normal, _vector, gated_attention_specs

ARCH = "qwen4exp"


@dataclass(frozen=True)
class Qwen4ExpShape:
    n_layers: int
    n_embd: int
    vocab: int
    hc: int
    hc_rank: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_rot: int
    indexer_heads: int
    indexer_dim: int
    top_k: int
    gdn_k_heads: int
    gdn_v_heads: int
    gdn_dim: int
    n_experts: int
    n_experts_used: int
    expert_ff: int
    head_vocab_sizes: tuple[int, ...] = HEAD_VOCAB_SIZES
    table_quant: str = "IQ4_NL"
    zero_table: bool = False  # write the table as a hole (full size) instead of random rows
    context_length: int = 262144
    expert_quant: str = "Q2_0"
    mtp: bool = False  # the MTP block after the trunk (blk.{n_layers}, nextn_predict_layers = 1)


PRESETS = {
    # Layer 3 is QSA, the others GDN; layer 1 has the n-gram block. 16 heads x 4 values = 64 = n_embd.
    "tiny": Qwen4ExpShape(n_layers=4, n_embd=64, vocab=512, hc=4, hc_rank=16, n_heads=4, n_kv_heads=2, head_dim=32,
                          n_rot=16, indexer_heads=2, indexer_dim=32, top_k=2048, gdn_k_heads=2, gdn_v_heads=6,
                          gdn_dim=16, n_experts=8, n_experts_used=2, expert_ff=64,
                          head_vocab_sizes=(97, 101, 103, 107, 109, 113, 127, 131, 137, 139, 149, 151, 157, 163, 167, 173),
                          table_quant="F16", context_length=4096),
    "full": Qwen4ExpShape(n_layers=48, n_embd=2560, vocab=248320, hc=4, hc_rank=320, n_heads=24, n_kv_heads=2,
                          head_dim=256, n_rot=64, indexer_heads=4, indexer_dim=128, top_k=2048, gdn_k_heads=16,
                          gdn_v_heads=48, gdn_dim=128, n_experts=512, n_experts_used=10, expert_ff=640,
                          zero_table=True),
}
TABLE_SCALE = 1.0  # n-gram rows are normed (key) or projected (value) before use: unit rows keep the block visible


def _hc(p: str, s: Qwen4ExpShape, seed: int, inject: bool = True) -> list[TensorSpec]:
    width = s.hc * s.n_embd
    out = [
        _vector(p + "norm.weight", width, 1.0),
        _matrix(p + "down.weight", (s.hc_rank, width), "BF16", seed),
        _matrix(p + "up.weight", (width, s.hc_rank), "BF16", seed),
    ]
    return out + ([_matrix(p + "inject.weight", (s.hc, width), "BF16", seed)] if inject else [])


def _gdn(p: str, s: Qwen4ExpShape, quant: str, seed: int) -> list[TensorSpec]:
    channels = (2 * s.gdn_k_heads + s.gdn_v_heads) * s.gdn_dim
    value_dim = s.gdn_v_heads * s.gdn_dim
    conv = _normal(np.random.default_rng([seed, *(p + "conv").encode()]), (channels, 4), 0.5)
    return [
        _matrix(p + "attn_qkv.weight", (channels, s.n_embd), quant, seed),
        _matrix(p + "attn_gate.weight", (value_dim, s.n_embd), quant, seed),
        _matrix(p + "ssm_out.weight", (s.n_embd, value_dim), quant, seed),
        TensorSpec(p + "ssm_conv1d.weight", (channels, 4), 0, lambda: conv),
        _matrix(p + "ssm_alpha.weight", (s.gdn_v_heads, s.n_embd), "BF16", seed),
        _matrix(p + "ssm_beta.weight", (s.gdn_v_heads, s.n_embd), "BF16", seed),
        _vector(p + "ssm_a", s.gdn_v_heads, -0.1),  # a slow decay
        _vector(p + "ssm_dt.bias", s.gdn_v_heads, 0.0),
        _vector(p + "ssm_norm.weight", s.gdn_dim, 1.0),
    ]


def _qsa(p: str, s: Qwen4ExpShape, quant: str, seed: int, indexer: bool = True) -> list[TensorSpec]:
    attention = gated_attention_specs(p, s, quant, seed)
    return attention + ([] if not indexer else [
        _matrix(p + "indexer.q_proj.weight", (s.indexer_heads * s.indexer_dim, s.n_embd), "BF16", seed),
        _matrix(p + "indexer.k_proj.weight", (s.indexer_dim, s.n_embd), "BF16", seed),
        _vector(p + "indexer.q_norm.weight", s.indexer_dim, 1.0),
        _vector(p + "indexer.k_norm.weight", s.indexer_dim, 1.0),
    ])


def _mtp(p: str, s: Qwen4ExpShape, quant: str, seed: int) -> list[TensorSpec]:
    """The MTP block: a QSA layer without indexer, its MoE, the two input projections and the final mixer."""
    out = _hc(p + "hc_attn_", s, seed) + _hc(p + "hc_ffn_", s, seed) + _qsa(p, s, quant, seed, indexer=False)
    return out + _moe(p, s, quant, seed) + _hc(p + "nextn.hc_out_", s, seed, inject=False) + [
        _matrix(p + "nextn.fc_embedding.weight", (s.n_embd, s.n_embd), quant, seed),
        _matrix(p + "nextn.fc_hidden.weight", (s.n_embd, s.n_embd), quant, seed),
        _vector(p + "nextn.norm_embedding.weight", s.n_embd, 1.0),
        _vector(p + "nextn.norm_hidden.weight", s.hc * s.n_embd, 1.0),
    ]


def _moe(p: str, s: Qwen4ExpShape, quant: str, seed: int) -> list[TensorSpec]:
    e, ff, eq = s.n_experts, s.expert_ff, s.expert_quant
    return [
        _matrix(p + "ffn_gate_inp.weight", (e, s.n_embd), "BF16", seed),
        _matrix(p + "ffn_gate_inp_shexp.weight", (s.n_embd,), "BF16", seed),
        _matrix(p + "ffn_gate_shexp.weight", (ff, s.n_embd), quant, seed),
        _matrix(p + "ffn_up_shexp.weight", (ff, s.n_embd), quant, seed),
        _matrix(p + "ffn_down_shexp.weight", (s.n_embd, ff), quant, seed),
        _matrix(p + "ffn_gate_exps.weight", (e, ff, s.n_embd), eq, seed),
        _matrix(p + "ffn_up_exps.weight", (e, ff, s.n_embd), eq, seed),
        _matrix(p + "ffn_down_exps.weight", (e, s.n_embd, ff), eq, seed),
    ]


def _ple(p: str, s: Qwen4ExpShape, quant: str, seed: int) -> list[TensorSpec]:
    width = s.hc * s.n_embd
    return [
        _matrix(p + "ple_key.weight", (width, s.n_embd), quant, seed),
        _matrix(p + "ple_value.weight", (s.n_embd, s.n_embd), "BF16", seed),
        *(_vector(p + f"ple_norm_{x}.weight", width, 1.0) for x in ("key", "query", "conv")),
        _matrix(p + "ple_conv1d.weight", (width, 4), "F16", seed),
    ]


def main_tensors(s: Qwen4ExpShape, quant: str, seed: int) -> list[TensorSpec]:
    out = [_matrix("token_embd.weight", (s.vocab, s.n_embd), quant, seed)]
    for i in range(s.n_layers):
        p = f"blk.{i}."
        out += _hc(p + "hc_attn_", s, seed) + _hc(p + "hc_ffn_", s, seed)
        out += _qsa(p, s, quant, seed) if i % 4 == 3 else _gdn(p, s, quant, seed)
        out += _moe(p, s, quant, seed) + (_ple(p, s, quant, seed) if i == 1 else [])
    out += _mtp(f"blk.{s.n_layers}.", s, quant, seed) if s.mtp else []
    return out + _hc("output_hc_", s, seed, inject=False) + [_matrix("output.weight", (s.vocab, s.n_embd), quant, seed)]


def table_tensor(s: Qwen4ExpShape, seed: int) -> TensorSpec:
    # Rows padded to a multiple of 256, as in the real file (320,001,536 rows for 320,001,446 addressed).
    shape = (-(-sum(s.head_vocab_sizes) // 256) * 256, s.n_embd // len(s.head_vocab_sizes))
    if not s.zero_table:
        return _matrix(TABLE_TENSOR, shape, s.table_quant, seed, scale=TABLE_SCALE)
    from strata.quant import get_format

    return TensorSpec(TABLE_TENSOR, shape, get_format(s.table_quant).ggml_type, None)


def metadata(s: Qwen4ExpShape, preset: str) -> dict:
    a = ARCH
    meta = {
        "general.name": f"strata-synthetic-{a}-{preset}",
        f"{a}.block_count": s.n_layers + s.mtp,
        f"{a}.context_length": s.context_length,
        f"{a}.embedding_length": s.n_embd,
        f"{a}.vocab_size": s.vocab,
        f"{a}.nextn_predict_layers": int(s.mtp),
        f"{a}.expert_count": s.n_experts,
        f"{a}.expert_used_count": s.n_experts_used,
        f"{a}.expert_feed_forward_length": s.expert_ff,
        f"{a}.expert_shared_feed_forward_length": s.expert_ff,
        f"{a}.attention.head_count": s.n_heads,
        f"{a}.attention.head_count_kv": s.n_kv_heads,
        f"{a}.attention.key_length": s.head_dim,
        f"{a}.attention.value_length": s.head_dim,
        f"{a}.attention.layer_norm_rms_epsilon": 1e-6,
        f"{a}.attention.indexer.head_count": s.indexer_heads,
        f"{a}.attention.indexer.key_length": s.indexer_dim,
        f"{a}.attention.indexer.top_k": s.top_k,
        f"{a}.rope.dimension_count": s.n_rot,
        f"{a}.rope.freq_base": 1e7,
        f"{a}.full_attention_interval": 4,
        f"{a}.hyper_connection.count": s.hc,
        f"{a}.hyper_connection.low_rank": s.hc_rank,
        f"{a}.ssm.conv_kernel": 4,
        f"{a}.ssm.state_size": s.gdn_dim,
        f"{a}.ssm.group_count": s.gdn_k_heads,
        f"{a}.ssm.time_step_rank": s.gdn_v_heads,
        f"{a}.ssm.inner_size": s.gdn_v_heads * s.gdn_dim,
        f"{a}.ple.layers": [1],
        f"{a}.ple.ngram_size": 3,
        f"{a}.ple.heads_per_ngram": len(s.head_vocab_sizes) // 2,
        f"{a}.ple.conv_kernel": 4,
        f"{a}.ple.eos_token_id": 248044,
        f"{a}.ple.layer_multipliers": list(MULTIPLIERS),
        f"{a}.ple.head_vocab_sizes": list(s.head_vocab_sizes),
        f"{a}.ple.head_offsets": [int(x) for x in np.cumsum((0,) + s.head_vocab_sizes[:-1])],
    }
    return meta


def shard_paths(path: Path) -> tuple[Path, Path]:
    """(main shard, table shard): `x.gguf` becomes x-00001-of-00002.gguf and x-00002-of-00002.gguf."""
    match = SPLIT_NAME.match(path.name)
    stem = match["stem"] if match else path.name.removesuffix(".gguf")
    return tuple(path.with_name(f"{stem}-{i:05d}-of-00002.gguf") for i in (1, 2))


def make_qwen4exp(path: str | Path, preset: str, quant: str, seed: int, progress: bool, **overrides) -> Path:
    from strata.tokenizer_train import train_small_bpe, write_tokenizer_metadata

    if preset not in PRESETS:
        raise StrataError(f"make-model: --arch {ARCH} has presets {', '.join(PRESETS)}, not {preset}")
    shape = replace(PRESETS[preset], **overrides)
    tokenizer = train_small_bpe(vocab_size=shape.vocab)
    main, table = shard_paths(Path(path))
    main.parent.mkdir(parents=True, exist_ok=True)
    tensors = main_tensors(shape, quant, seed)
    split = {"split.count": 2, "split.tensors.count": len(tensors) + 1}
    # Each shard is written beside its target and renamed at the end, so an interrupted run leaves no shard.
    for target, specs, meta, extra in (
        (table, [table_tensor(shape, seed)], {"split.no": 1, **split}, None),
        (main, tensors, {**metadata(shape, preset), "split.no": 0, **split},
         lambda w: write_tokenizer_metadata(w, tokenizer)),
    ):
        tmp = target.with_name(target.name + ".partial")
        write_gguf(tmp, ARCH, meta, specs, extra=extra, progress=progress)
        tmp.replace(target)
    return main
