"""Tiny random transformers models, written as GGUF under llama.cpp's names: the oracle for parity tests.

The engine is later compared logit by logit against transformers on these files, so each tensor is written
exactly as llama.cpp's converter lays it out: nn.Linear weights as they are ([out, in] in numpy, so ggml's
ne = [in, out]), qwen2/qwen3 q/k not permuted, experts stacked into one [n_expert, ...] tensor per role.

    python tools/export_hf.py --arch qwen3moe --qtype Q8_0 -o out.gguf [--seed N] [--set num_experts=16]

Q4_K rows come in blocks of 256, so the CLI makes Q4_K models with K_QUANT_SIZES.
"""

from __future__ import annotations

import argparse
import copy
import logging
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch

if __package__ in (None, ""):  # run as a script: make `strata` importable from the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from strata.gguf import Q2_0  # noqa: E402  (after the path fix above)

log = logging.getLogger(__name__)

# The GGUF architecture name -> (transformers config class, model class), by name to import lazily.
ARCHS = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "qwen3moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
    "qwen3next": ("Qwen3NextConfig", "Qwen3NextForCausalLM"),
}

TINY = dict(
    vocab_size=512,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=False,
)
TINY_MOE = dict(
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
)
# Qwen3-Next: GatedDeltaNet layers with full attention every second layer (0-based 1 and 3), 4 value heads on 2
# key heads, half of each attention head rotated, and a sigmoid-gated shared expert beside the routed ones.
TINY_QWEN3NEXT = dict(
    TINY_MOE,
    num_hidden_layers=4,
    full_attention_interval=2,
    partial_rotary_factor=0.5,
    linear_conv_kernel_dim=4,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    shared_expert_intermediate_size=64,
)
# Q4_K packs rows in blocks of 256: these sizes make every weight row (n_embd, n_ff, n_head*head_dim) fit.
K_QUANT_SIZES = dict(hidden_size=256, head_dim=64, intermediate_size=256, moe_intermediate_size=256)

QTYPES = {
    "F32": gguf.GGMLQuantizationType.F32,
    "F16": gguf.GGMLQuantizationType.F16,
    "Q8_0": gguf.GGMLQuantizationType.Q8_0,
    "Q4_K": gguf.GGMLQuantizationType.Q4_K,
    "Q2_0": Q2_0,  # Strata's type 42, which gguf-py only knows once strata.gguf registers it
}
FILE_TYPES = {
    "F32": gguf.LlamaFileType.ALL_F32,
    "F16": gguf.LlamaFileType.MOSTLY_F16,
    "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    "Q4_K": gguf.LlamaFileType.MOSTLY_Q4_K_S,  # every matrix in Q4_K, as llama.cpp's Q4_K_S mostly is
}


def make_hf_model(arch: str, seed: int = 0, mtp: bool = False, **overrides) -> torch.nn.Module:
    """A tiny float32 transformers model of `arch` in eval mode, every parameter drawn from `seed`. `mtp` (qwen3next)
    adds the checkpoint's `mtp.*` block as a submodule that transformers' forward never calls."""
    import transformers

    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; known: {sorted(ARCHS)}")
    config_name, model_name = ARCHS[arch]
    extra = {"qwen3moe": TINY_MOE, "qwen3next": TINY_QWEN3NEXT}.get(arch, {})
    fields = {**TINY, **extra, **overrides}
    config = getattr(transformers, config_name)(**fields)
    model = getattr(transformers, model_name)(config).to(torch.float32).eval()
    if mtp:
        if arch != "qwen3next":
            raise ValueError(f"only qwen3next checkpoints carry an mtp.* block, not {arch}")
        model.mtp = mtp_block(config)  # registered after every other parameter: their random draws stay the same
    _redraw(model, seed)
    return model


def mtp_block(config) -> torch.nn.Module:
    """Qwen3-Next's multi-token-prediction block with the checkpoint's parameter names (`mtp.fc.weight`,
    `mtp.pre_fc_norm_{embedding,hidden}.weight`, `mtp.layers.0.*` a full-attention MoE decoder layer, `mtp.norm.weight`)."""
    from transformers.models.qwen3_next import modeling_qwen3_next as hf

    attention_layer = config.layer_types.index("full_attention")  # the layer class reads its kind from here
    block = torch.nn.Module()
    block.fc = torch.nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)
    block.pre_fc_norm_embedding = hf.Qwen3NextRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
    block.pre_fc_norm_hidden = hf.Qwen3NextRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
    block.layers = torch.nn.ModuleList([hf.Qwen3NextDecoderLayer(config, attention_layer)])
    block.norm = hf.Qwen3NextRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
    return block.to(torch.float32).eval()


def attach_checkpoint_mtp(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Give a loaded transformers Qwen3-Next (which drops `mtp.*`) the checkpoint's MTP block: `tensors` by their
    checkpoint names, experts one by one (`mtp.layers.0.mlp.experts.{e}.{gate,up,down}_proj.weight`)."""
    block = mtp_block(model.config)
    params = dict(block.named_parameters())
    experts: dict[tuple[str, str], dict[int, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        match = re.fullmatch(r"mtp\.(layers\.\d+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight", name)
        if match:
            experts.setdefault((match[1], match[3]), {})[int(match[2])] = tensor
        elif name.startswith("mtp.") and name[4:] in params:
            params.pop(name[4:]).data.copy_(tensor)
        else:
            raise ValueError(f"checkpoint tensor {name} is not part of Qwen3-Next's MTP block")
    n = model.config.num_experts
    for (prefix, part), by_expert in sorted(experts.items()):
        if sorted(by_expert) != list(range(n)):
            raise ValueError(f"mtp.{prefix}: {part}_proj of {len(by_expert)} experts, the config has {n}")
    for prefix in {prefix for prefix, _ in experts}:
        stack = {part: torch.stack([experts[(prefix, part)][e] for e in range(n)]) for part in ("gate", "up", "down")}
        params.pop(f"{prefix}.gate_up_proj").data.copy_(torch.cat((stack["gate"], stack["up"]), dim=1))
        params.pop(f"{prefix}.down_proj").data.copy_(stack["down"])
    if params:
        raise ValueError(f"the checkpoint lacks MTP tensors: {', '.join('mtp.' + name for name in sorted(params))}")
    model.mtp = block


def mtp_layer_count(model: torch.nn.Module) -> int:
    block = getattr(model, "mtp", None)
    return len(block.layers) if block is not None else 0


def _redraw(model: torch.nn.Module, seed: int) -> None:
    """Replace the init (zeros for routers, ones for norms) so a swapped or mis-read tensor changes the logits."""
    generator = torch.Generator().manual_seed(seed)
    centred = model.config.model_type == "qwen3_next"  # its RMSNorms scale by (1 + w)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
            if name.endswith(".A_log"):  # decay exp(-A softplus(.)) near 0.85 per token: the state lasts a while
                param.copy_(-2.0 + 0.5 * noise)
            elif name.endswith((".bias", ".dt_bias")):
                param.copy_(0.1 * noise)
            elif param.ndim == 1:  # RMSNorm gains
                param.copy_((0.0 if centred and not name.endswith("linear_attn.norm.weight") else 1.0) + 0.1 * noise)
            elif "embed_tokens" in name:
                param.copy_(noise)
            else:  # unit-variance inputs stay unit-variance through each matrix
                param.copy_(noise * param.shape[-1] ** -0.5)


# ---------------------------------------------------------------------------------------------- names


@dataclass(frozen=True)
class TensorSource:
    """One GGUF tensor and where it comes from: a transformers parameter, or one half of a fused one."""

    gguf_name: str
    hf_name: str
    half: int | None = None  # 0 or 1: first or second half of dim 1 (gate / up of a fused gate_up_proj)
    rows: tuple[int, ...] | None = None  # these rows of dim 0, in this order (Qwen3-Next's in_proj_qkvz split)
    transform: str | None = None  # a llama.cpp conversion of the values: see TRANSFORMS


# Per-layer parameter suffix -> llama.cpp tensor name (without "blk.N." and ".weight"/".bias").
_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "mlp.gate": "ffn_gate_inp",  # the MoE router
}
# Qwen3-Next's own parameters (transformers name -> llama.cpp name, transform).
_QWEN3NEXT_NAMES = {
    "input_layernorm.weight": ("attn_norm.weight", "plus_one"),
    "post_attention_layernorm.weight": ("post_attention_norm.weight", "plus_one"),
    "self_attn.q_norm.weight": ("attn_q_norm.weight", "plus_one"),
    "self_attn.k_norm.weight": ("attn_k_norm.weight", "plus_one"),
    "linear_attn.in_proj_ba.weight": ("ssm_ba.weight", None),
    "linear_attn.conv1d.weight": ("ssm_conv1d.weight", "squeeze"),
    "linear_attn.dt_bias": ("ssm_dt.bias", None),
    "linear_attn.A_log": ("ssm_a", "neg_exp"),
    "linear_attn.norm.weight": ("ssm_norm.weight", None),  # a plain gated RMSNorm weight: no +1
    "linear_attn.out_proj.weight": ("ssm_out.weight", None),
    "mlp.shared_expert.gate_proj.weight": ("ffn_gate_shexp.weight", None),
    "mlp.shared_expert.up_proj.weight": ("ffn_up_shexp.weight", None),
    "mlp.shared_expert.down_proj.weight": ("ffn_down_shexp.weight", None),
    "mlp.shared_expert_gate.weight": ("ffn_gate_inp_shexp.weight", None),
}
# Each applies to a tensor llama.cpp stores in F32 (norms, A, the conv), so the values are never quantized.
TRANSFORMS = {
    "plus_one": lambda t: t + 1.0,  # (1 + w) RMSNorms, baked in as llama.cpp does
    "neg_exp": lambda t: -torch.exp(t),  # A_log -> A = -exp(A_log)
    "squeeze": lambda t: t.squeeze(1),  # depthwise conv weight [channels, 1, kernel] -> [channels, kernel]
}
_GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
# Qwen3-Next's MTP block -> llama.cpp's nextn names on block n_layer (its decoder layer keeps the layer names there);
# its RMSNorms scale by (1 + w) like the trunk's. docs/ARCHITECTURES.md lists the mapping.
_MTP_NAMES = {
    "mtp.fc.weight": ("nextn.eh_proj.weight", None),  # [embd, 2 embd]: input = [normed embedding, normed hidden]
    "mtp.pre_fc_norm_embedding.weight": ("nextn.enorm.weight", "plus_one"),
    "mtp.pre_fc_norm_hidden.weight": ("nextn.hnorm.weight", "plus_one"),
    "mtp.norm.weight": ("nextn.shared_head_norm.weight", "plus_one"),
}


def _qkvz_rows(config) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """in_proj_qkvz's rows as llama.cpp splits them: (attn_qkv = all q, all k, all v; attn_gate = all z)."""
    from strata.models.gated_deltanet import GDNShape

    shape = GDNShape(n_k_heads=config.linear_num_key_heads, n_v_heads=config.linear_num_value_heads,
                     k_dim=config.linear_key_head_dim, v_dim=config.linear_value_head_dim,
                     conv_kernel=config.linear_conv_kernel_dim)
    qkv, z = shape.qkvz_rows()
    return tuple(qkv), tuple(z)


def tensor_sources(model: torch.nn.Module) -> list[TensorSource]:
    """Every GGUF tensor of `model`, in file order; raises on a parameter it has no name for."""
    tied = model.config.tie_word_embeddings
    next_arch = model.config.model_type == "qwen3_next"
    sources = []
    for hf_name, _ in model.named_parameters(remove_duplicate=False):
        if hf_name in _GLOBAL_NAMES:
            if not (tied and hf_name == "lm_head.weight"):  # llama.cpp omits output.weight when tied
                transform = "plus_one" if next_arch and hf_name == "model.norm.weight" else None
                sources.append(TensorSource(_GLOBAL_NAMES[hf_name], hf_name, transform=transform))
            continue
        if next_arch and hf_name in _MTP_NAMES:
            name, transform = _MTP_NAMES[hf_name]
            sources.append(TensorSource(f"blk.{model.config.num_hidden_layers}.{name}", hf_name, transform=transform))
            continue
        match = re.fullmatch(r"(model|mtp)\.layers\.(\d+)\.(.+)\.(\w+)", hf_name)
        if match is None or (match[1] == "mtp" and not next_arch):
            raise ValueError(f"no GGUF name for parameter {hf_name}")
        layer = int(match[2]) + (model.config.num_hidden_layers if match[1] == "mtp" else 0)
        blk, module, kind = f"blk.{layer}", match[3], match[4]
        if next_arch and f"{module}.{kind}" in _QWEN3NEXT_NAMES:
            name, transform = _QWEN3NEXT_NAMES[f"{module}.{kind}"]
            sources.append(TensorSource(f"{blk}.{name}", hf_name, transform=transform))
        elif next_arch and module == "linear_attn.in_proj_qkvz":
            qkv_rows, z_rows = _qkvz_rows(model.config)
            sources.append(TensorSource(f"{blk}.attn_qkv.weight", hf_name, rows=qkv_rows))
            sources.append(TensorSource(f"{blk}.attn_gate.weight", hf_name, rows=z_rows))
        elif module == "mlp.experts" and kind == "gate_up_proj":  # [E, 2*n_ff, n_embd], gate rows first
            sources.append(TensorSource(f"{blk}.ffn_gate_exps.weight", hf_name, half=0))
            sources.append(TensorSource(f"{blk}.ffn_up_exps.weight", hf_name, half=1))
        elif module == "mlp.experts" and kind == "down_proj":  # [E, n_embd, n_ff]
            sources.append(TensorSource(f"{blk}.ffn_down_exps.weight", hf_name))
        elif module in _LAYER_NAMES and kind in ("weight", "bias"):
            sources.append(TensorSource(f"{blk}.{_LAYER_NAMES[module]}.{kind}", hf_name))
        else:
            raise ValueError(f"no GGUF name for parameter {hf_name}")
    return sources


def _source_array(params: dict[str, torch.Tensor], source: TensorSource) -> np.ndarray:
    tensor = params[source.hf_name].detach()
    if source.half is not None:
        tensor = tensor.chunk(2, dim=1)[source.half]
    if source.rows is not None:
        tensor = tensor[list(source.rows)]
    if source.transform is not None:
        tensor = TRANSFORMS[source.transform](tensor.to(torch.float32))
    return np.ascontiguousarray(tensor.to(torch.float32).numpy())


# ---------------------------------------------------------------------------------------------- types


def stored_qtype(gguf_name: str, ndim: int, qtype: str) -> str:
    """The type a tensor is written in: norms, biases, routers and the GDN conv stay F32 (llama.cpp never
    quantizes those)."""
    if ndim < 2 or not gguf_name.endswith(".weight") or gguf_name.endswith(F32_SUFFIXES):
        return "F32"
    return qtype


F32_SUFFIXES = ("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "ssm_conv1d.weight", "norm.weight")


def encode(array: np.ndarray, qtype: str) -> np.ndarray:
    """`array` (float32) as stored in the file: float32/float16 values, or uint8 blocks [..., row_bytes]."""
    if qtype == "F32":
        return array.astype(np.float32)
    if qtype == "F16":
        return array.astype(np.float16)
    block, _ = gguf.GGML_QUANT_SIZES[QTYPES[qtype]]
    if array.shape[-1] % block:
        raise ValueError(
            f"{qtype} packs rows in blocks of {block}; a row of {array.shape[-1]} does not fit "
            f"(make the model with sizes like {K_QUANT_SIZES})"
        )
    from strata.quant import quantize

    return quantize(array, qtype)


def decode(data: np.ndarray, qtype: str) -> np.ndarray:
    """The float32 values a reader gets back from `encode`'s output, by gguf-py's reference dequantizer."""
    if qtype in ("F32", "F16"):
        return data.astype(np.float32)
    if qtype == "Q2_0":  # gguf-py has no Q2_0 dequantizer; ours is checked against the format's definition
        from strata.quant import dequantize

        rows = torch.from_numpy(np.ascontiguousarray(data))
        return dequantize(rows, qtype, (*data.shape[:-1], data.shape[-1] // 18 * 64)).numpy()
    return gguf.quants.dequantize(data, QTYPES[qtype]).astype(np.float32)


# ---------------------------------------------------------------------------------------------- writing


def gguf_arch(model: torch.nn.Module) -> str:
    model_type = model.config.model_type
    arch = {"qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3moe", "qwen3_next": "qwen3next"}.get(model_type)
    if arch is None:
        raise ValueError(f"no GGUF architecture for model_type {model_type!r}")
    return arch


def _write_hparams(writer: gguf.GGUFWriter, config, arch: str, qtype: str, n_mtp: int = 0) -> None:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_name(f"strata-tiny-{arch}")
    if qtype in FILE_TYPES:
        writer.add_file_type(FILE_TYPES[qtype])
    if qtype not in ("F32", "F16"):
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_block_count(config.num_hidden_layers + n_mtp)
    if n_mtp:
        writer.add_nextn_predict_layers(n_mtp)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    # llama.cpp takes the vocabulary size from the tokenizer when this is absent; the file may carry none
    writer.add_vocab_size(config.vocab_size)
    if arch == "qwen3moe":
        if config.mlp_only_layers or config.decoder_sparse_step != 1:
            raise ValueError("qwen3moe in llama.cpp has every layer MoE: mlp_only_layers / decoder_sparse_step")
        if not config.norm_topk_prob:
            raise ValueError("qwen3moe in llama.cpp renormalizes the top-k weights: norm_topk_prob must be True")
        writer.add_expert_count(config.num_experts)
        writer.add_expert_used_count(config.num_experts_per_tok)
        writer.add_expert_feed_forward_length(config.moe_intermediate_size)
    if arch == "qwen3next":
        _write_qwen3next_hparams(writer, config, head_dim)


def full_attention_interval(layer_types: list[str]) -> int:
    """The n with layer i full attention iff (i + 1) % n == 0, the only pattern llama.cpp's qwen3next reads."""
    for n in range(1, len(layer_types) + 1):
        if all((t == "full_attention") == ((i + 1) % n == 0) for i, t in enumerate(layer_types)):
            return n
    raise ValueError(f"layer_types {layer_types} is not 'full attention every n-th layer'; llama.cpp cannot express it")


def _write_qwen3next_hparams(writer: gguf.GGUFWriter, config, head_dim: int) -> None:
    if config.mlp_only_layers or config.decoder_sparse_step != 1:
        raise ValueError("qwen3next in llama.cpp has every layer MoE: mlp_only_layers / decoder_sparse_step")
    if not config.norm_topk_prob:
        raise ValueError("qwen3next in llama.cpp renormalizes the top-k weights: norm_topk_prob must be True")
    if config.attention_bias:
        raise ValueError("qwen3next in llama.cpp has no attention biases")
    nk, nv = config.linear_num_key_heads, config.linear_num_value_heads
    if config.linear_key_head_dim != config.linear_value_head_dim or nv % nk:
        raise ValueError("qwen3next in llama.cpp needs linear key and value head dims equal, value heads a multiple of key heads")
    writer.add_expert_count(config.num_experts)
    writer.add_expert_used_count(config.num_experts_per_tok)
    writer.add_expert_feed_forward_length(config.moe_intermediate_size)
    writer.add_expert_shared_feed_forward_length(config.shared_expert_intermediate_size)
    # transformers 5 keeps the factor inside rope_parameters; llama.cpp's converter reads the top-level one
    partial = config.rope_parameters.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 0.25))
    writer.add_rope_dimension_count(int(head_dim * partial))
    writer.add_ssm_conv_kernel(config.linear_conv_kernel_dim)
    writer.add_ssm_state_size(config.linear_key_head_dim)
    writer.add_ssm_group_count(nk)
    writer.add_ssm_time_step_rank(nv)
    writer.add_ssm_inner_size(config.linear_value_head_dim * nv)
    writer.add_full_attention_interval(full_attention_interval(config.layer_types))


def export_gguf(model: torch.nn.Module, path, qtype: str = "F32", tokenizer_metadata: dict | None = None) -> None:
    """Write `model` to `path` as llama.cpp would: its names and hparams, matrices in `qtype`."""
    if qtype not in QTYPES:
        raise ValueError(f"unknown qtype {qtype!r}; known: {sorted(QTYPES)}")
    arch = gguf_arch(model)
    tokens = (tokenizer_metadata or {}).get("tokenizer.ggml.tokens")
    if tokens is not None and len(tokens) != model.config.vocab_size:
        raise ValueError(f"the tokenizer has {len(tokens)} tokens and the model {model.config.vocab_size} rows")
    writer = gguf.GGUFWriter(str(path), arch)
    _write_hparams(writer, model.config, arch, qtype, mtp_layer_count(model))
    if tokenizer_metadata is not None:
        try:
            from strata.tokenizer_train import write_tokenizer_metadata
        except ImportError:
            log.warning("strata.tokenizer_train is not importable: writing no tokenizer")
        else:
            write_tokenizer_metadata(writer, tokenizer_metadata)

    params = dict(model.named_parameters(remove_duplicate=False))
    for source in tensor_sources(model):
        array = _source_array(params, source)
        tensor_qtype = stored_qtype(source.gguf_name, array.ndim, qtype)
        try:
            data = encode(array, tensor_qtype)
        except ValueError as error:
            raise ValueError(f"{source.gguf_name}: {error}") from None
        raw_dtype = QTYPES[tensor_qtype] if data.dtype == np.uint8 else None
        writer.add_tensor(source.gguf_name, data, raw_dtype=raw_dtype)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def dequantized_hf_model(model: torch.nn.Module, qtype: str) -> torch.nn.Module:
    """A copy of `model` holding the weights a reader of `export_gguf(model, qtype=qtype)` gets back."""
    copied = copy.deepcopy(model)
    params = dict(copied.named_parameters(remove_duplicate=False))
    with torch.no_grad():
        for source in tensor_sources(copied):
            array = _source_array(params, source)
            tensor_qtype = stored_qtype(source.gguf_name, array.ndim, qtype)
            if tensor_qtype == "F32":
                continue  # stored exactly (every transformed tensor is one of these)
            values = torch.from_numpy(decode(encode(array, tensor_qtype), tensor_qtype)).reshape(array.shape)
            target = params[source.hf_name]
            if source.half is not None:
                target = target.chunk(2, dim=1)[source.half]
            if source.rows is not None:
                target[list(source.rows)] = values
            else:
                target.copy_(values)
    return copied


# ---------------------------------------------------------------------------------------------- CLI


def _parse_value(text: str):
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", required=True, choices=sorted(ARCHS))
    parser.add_argument("--qtype", default="F32", choices=sorted(QTYPES))
    parser.add_argument("-o", "--output", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override")
    parser.add_argument("--mtp", action="store_true", help="qwen3next: add a random mtp.* block (blk.N.nextn.*)")
    args = parser.parse_args(argv)
    overrides = K_QUANT_SIZES if args.qtype == "Q4_K" else {}  # the tiny sizes do not fill a 256-block
    overrides = {**overrides, **{key: _parse_value(value) for key, value in (s.split("=", 1) for s in args.set)}}
    model = make_hf_model(args.arch, args.seed, mtp=args.mtp, **overrides)
    export_gguf(model, args.output, args.qtype)
    print(f"wrote {args.output} ({args.arch}, {args.qtype}, seed {args.seed})")


if __name__ == "__main__":
    main()
