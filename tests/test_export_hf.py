"""The exporter is the oracle: each file must load back through transformers' own GGUF loader to the same
weights and the same logits, so llama.cpp's names, shapes and layouts are checked by an independent reader."""

import importlib.util
import re

import gguf
import numpy as np
import pytest
import torch

from tools.export_hf import (
    ARCHS,
    K_QUANT_SIZES,
    _qkvz_rows,
    tensor_sources,
    dequantized_hf_model,
    encode,
    export_gguf,
    main,
    make_hf_model,
)

transformers = pytest.importorskip("transformers")
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint  # noqa: E402

TOKENS = torch.tensor([[1, 5, 77, 300, 511, 2, 9, 64]])
# transformers' GGUF loader has no qwen3next: that export is checked against gguf-py's names and llama.cpp's
# conversion rules below, and end to end by tests/models/test_qwen3next.py.
LOADABLE = [arch for arch in sorted(ARCHS) if arch != "qwen3next"]


def _config_gaps(path) -> dict:
    """Config fields transformers' GGUF loader does not read for these archs, taken from the file itself.

    Its key map has no `attention.key_length` for qwen3 (so head_dim falls back to the class default, 128)
    and no `expert_feed_forward_length` for qwen3moe (moe_intermediate_size falls back to 768).
    """
    fields = gguf.GGUFReader(path).fields
    arch = fields["general.architecture"].contents()
    gaps = {"head_dim": fields[f"{arch}.attention.key_length"].contents()}
    if arch == "qwen3moe":
        gaps["moe_intermediate_size"] = fields[f"{arch}.expert_feed_forward_length"].contents()
    return gaps


def _load_with_transformers(path):
    """What `from_pretrained(gguf_file=...)` does for these archs, without the accelerate it insists on."""
    config = transformers.AutoConfig.from_pretrained(path.parent, gguf_file=path.name, **_config_gaps(path))
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    assert unexpected == []
    assert missing == (["lm_head.weight"] if config.tie_word_embeddings else [])
    return model


def _head_dim(config) -> int:
    # Qwen2Config has no head_dim field: the attention takes hidden_size / heads
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _assert_same_model(expected, loaded):
    ours, theirs = expected.config, loaded.config
    assert type(loaded) is type(expected)
    for field in (
        "num_hidden_layers",
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
        "max_position_embeddings",
        "tie_word_embeddings",
        "num_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "norm_topk_prob",
    ):
        assert getattr(theirs, field, None) == getattr(ours, field, None), field
    assert _head_dim(theirs) == _head_dim(ours)
    assert theirs.rope_parameters["rope_theta"] == ours.rope_parameters["rope_theta"]
    assert theirs.rms_norm_eps == np.float32(ours.rms_norm_eps)  # GGUF stores it as float32

    theirs_params = dict(loaded.named_parameters(remove_duplicate=False))
    ours_params = dict(expected.named_parameters(remove_duplicate=False))
    assert theirs_params.keys() == ours_params.keys()
    for name, param in ours_params.items():
        assert torch.equal(theirs_params[name], param), name
    with torch.no_grad():
        assert torch.equal(loaded(TOKENS).logits, expected(TOKENS).logits)


@pytest.mark.parametrize("arch", LOADABLE)
def test_f32_loads_back_identically(arch, tmp_path):
    model = make_hf_model(arch)
    path = tmp_path / f"{arch}.gguf"
    export_gguf(model, path)
    _assert_same_model(model, _load_with_transformers(path))


def test_tied_embeddings_omit_output(tmp_path):
    model = make_hf_model("qwen3", tie_word_embeddings=True)
    path = tmp_path / "tied.gguf"
    export_gguf(model, path)
    assert "output.weight" not in {t.name for t in gguf.GGUFReader(path).tensors}
    loaded = _load_with_transformers(path)
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    _assert_same_model(model, loaded)


@pytest.mark.parametrize("arch", LOADABLE)
@pytest.mark.parametrize("qtype", ["F16", "Q8_0"])
def test_quantized_loads_back_as_dequantized_model(arch, qtype, tmp_path):
    model = make_hf_model(arch, seed=1)
    path = tmp_path / f"{arch}-{qtype}.gguf"
    export_gguf(model, path, qtype)
    expected = dequantized_hf_model(model, qtype)
    assert not torch.equal(expected.model.embed_tokens.weight, model.model.embed_tokens.weight)
    _assert_same_model(expected, _load_with_transformers(path))


def test_q4_k_loads_back_as_dequantized_model(tmp_path):
    try:
        from strata.quant import quantize  # noqa: F401
    except ImportError:
        pytest.skip("strata.quant.quantize has not landed")
    model = make_hf_model("qwen3moe", **K_QUANT_SIZES)
    path = tmp_path / "q4k.gguf"
    export_gguf(model, path, "Q4_K")
    _assert_same_model(dequantized_hf_model(model, "Q4_K"), _load_with_transformers(path))


def test_rows_that_do_not_fill_a_block_are_refused():
    with pytest.raises(ValueError, match="blocks of 256"):
        encode(np.zeros((4, 64), np.float32), "Q4_K")


def _expected_layout(arch: str, tied: bool = False) -> dict[str, tuple[tuple[int, ...], str]]:
    """llama.cpp's tensor names -> (numpy shape, type) for the tiny model written in Q8_0."""
    n_embd, n_ff, n_vocab, n_q, n_kv, n_expert, n_ff_exp = 64, 128, 512, 64, 32, 8, 32
    layout = {"token_embd.weight": ((n_vocab, n_embd), "Q8_0"), "output_norm.weight": ((n_embd,), "F32")}
    if not tied:
        layout["output.weight"] = ((n_vocab, n_embd), "Q8_0")
    for i in range(2):
        blk = f"blk.{i}"
        layout |= {
            f"{blk}.attn_norm.weight": ((n_embd,), "F32"),
            f"{blk}.attn_q.weight": ((n_q, n_embd), "Q8_0"),
            f"{blk}.attn_k.weight": ((n_kv, n_embd), "Q8_0"),
            f"{blk}.attn_v.weight": ((n_kv, n_embd), "Q8_0"),
            f"{blk}.attn_output.weight": ((n_embd, n_q), "Q8_0"),
            f"{blk}.ffn_norm.weight": ((n_embd,), "F32"),
        }
        if arch == "qwen2":
            layout |= {f"{blk}.attn_{x}.bias": ((n,), "F32") for x, n in (("q", n_q), ("k", n_kv), ("v", n_kv))}
        else:
            layout |= {f"{blk}.attn_q_norm.weight": ((16,), "F32"), f"{blk}.attn_k_norm.weight": ((16,), "F32")}
        if arch == "qwen3moe":
            layout |= {
                f"{blk}.ffn_gate_inp.weight": ((n_expert, n_embd), "F32"),
                f"{blk}.ffn_gate_exps.weight": ((n_expert, n_ff_exp, n_embd), "Q8_0"),
                f"{blk}.ffn_up_exps.weight": ((n_expert, n_ff_exp, n_embd), "Q8_0"),
                f"{blk}.ffn_down_exps.weight": ((n_expert, n_embd, n_ff_exp), "Q8_0"),
            }
        else:
            layout |= {
                f"{blk}.ffn_gate.weight": ((n_ff, n_embd), "Q8_0"),
                f"{blk}.ffn_up.weight": ((n_ff, n_embd), "Q8_0"),
                f"{blk}.ffn_down.weight": ((n_embd, n_ff), "Q8_0"),
            }
    return layout


@pytest.mark.parametrize("arch", LOADABLE)
def test_file_layout_and_metadata(arch, tmp_path):
    path = tmp_path / f"{arch}.gguf"
    export_gguf(make_hf_model(arch), path, "Q8_0")
    reader = gguf.GGUFReader(path)

    layout = {t.name: (tuple(int(n) for n in reversed(t.shape)), t.tensor_type.name) for t in reader.tensors}
    assert layout == _expected_layout(arch)

    metadata = {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}
    expected = {
        "general.architecture": arch,
        "general.name": f"strata-tiny-{arch}",
        "general.file_type": int(gguf.LlamaFileType.MOSTLY_Q8_0),
        "general.quantization_version": gguf.GGML_QUANT_VERSION,
        f"{arch}.block_count": 2,
        f"{arch}.context_length": 256,
        f"{arch}.embedding_length": 64,
        f"{arch}.feed_forward_length": 128,
        f"{arch}.attention.head_count": 4,
        f"{arch}.attention.head_count_kv": 2,
        f"{arch}.attention.key_length": 16,
        f"{arch}.attention.value_length": 16,
        f"{arch}.rope.freq_base": 10000.0,
        f"{arch}.attention.layer_norm_rms_epsilon": pytest.approx(1e-6, rel=1e-7),
        f"{arch}.vocab_size": 512,
    }
    if arch == "qwen3moe":
        expected |= {f"{arch}.expert_count": 8, f"{arch}.expert_used_count": 2, f"{arch}.expert_feed_forward_length": 32}
    assert metadata == expected


def test_expert_halves_are_gate_then_up(tmp_path):
    """The fused gate_up_proj splits on dim 1, gate first, as transformers' forward chunks it."""
    model = make_hf_model("qwen3moe")
    path = tmp_path / "moe.gguf"
    export_gguf(model, path)
    tensors = {t.name: t.data for t in gguf.GGUFReader(path).tensors}
    experts = model.model.layers[1].mlp.experts
    n_ff = model.config.moe_intermediate_size
    np.testing.assert_array_equal(tensors["blk.1.ffn_gate_exps.weight"], experts.gate_up_proj[:, :n_ff].detach())
    np.testing.assert_array_equal(tensors["blk.1.ffn_up_exps.weight"], experts.gate_up_proj[:, n_ff:].detach())
    np.testing.assert_array_equal(tensors["blk.1.ffn_down_exps.weight"], experts.down_proj.detach())


def test_seeded_weights_are_not_the_init():
    a, b, c = make_hf_model("qwen3", seed=3), make_hf_model("qwen3", seed=3), make_hf_model("qwen3", seed=4)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters(), strict=True):
        assert torch.equal(pa, pb) and not torch.equal(pa, pc), name
    assert not torch.equal(a.model.norm.weight, torch.ones_like(a.model.norm.weight))
    assert not torch.equal(a.model.layers[0].self_attn.q_norm.weight, a.model.layers[1].self_attn.q_norm.weight)


def test_tokenizer_metadata_is_written(tmp_path):
    tokenizer_train = pytest.importorskip("strata.tokenizer_train")
    metadata = tokenizer_train.train_small_bpe(512)
    model = make_hf_model("qwen2")
    path = tmp_path / "tok.gguf"
    export_gguf(model, path, tokenizer_metadata=metadata)
    fields = gguf.GGUFReader(path).fields
    assert set(metadata) <= set(fields)
    assert len(fields["tokenizer.ggml.tokens"].contents()) == 512
    _assert_same_model(model, _load_with_transformers(path))
    with pytest.raises(ValueError, match="512 tokens"):
        export_gguf(make_hf_model("qwen2", vocab_size=256), tmp_path / "bad.gguf", tokenizer_metadata=metadata)


@pytest.mark.skipif(importlib.util.find_spec("accelerate") is None, reason="from_pretrained(gguf_file=) needs accelerate")
def test_from_pretrained(tmp_path):
    model = make_hf_model("qwen3moe")
    path = tmp_path / "moe.gguf"
    export_gguf(model, path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, **_config_gaps(path))
    _assert_same_model(model, loaded.eval())


def test_cli_writes_a_file(tmp_path):
    path = tmp_path / "cli.gguf"
    main(["--arch", "qwen3moe", "--qtype", "Q8_0", "-o", str(path), "--seed", "2", "--set", "num_experts=4"])
    fields = gguf.GGUFReader(path).fields
    assert fields["general.architecture"].contents() == "qwen3moe"
    assert fields["qwen3moe.expert_count"].contents() == 4


# ---------------------------------------------------------------------------------------------- qwen3next


def _qwen3next_export(tmp_path, qtype="F32", **overrides):
    model = make_hf_model("qwen3next", **overrides)
    path = tmp_path / f"qwen3next-{qtype}.gguf"
    export_gguf(model, path, qtype)
    reader = gguf.GGUFReader(path)
    return model, reader, {t.name: t for t in reader.tensors}


def test_qwen3next_names_are_gguf_py_names(tmp_path):
    """Every tensor has a QWEN3NEXT name, and gguf-py's own HF -> GGUF map agrees with ours."""
    model, _, tensors = _qwen3next_export(tmp_path)
    arch = gguf.MODEL_ARCH.QWEN3NEXT
    known = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[arch]}
    name_map = gguf.get_tensor_name_map(arch, model.config.num_hidden_layers)
    for source in tensor_sources(model):
        base = source.gguf_name.removesuffix(".weight").removesuffix(".bias")
        assert re.sub(r"blk\.\d+\.", "blk.{bid}.", base) in known, source.gguf_name
        hf = source.hf_name.removesuffix(".weight").removesuffix(".bias").replace(".dt_bias", ".dt_proj")
        hf = hf.replace(".gate_up_proj", ".gate_proj" if source.half == 0 else ".up_proj")
        expected = name_map.get_name(hf)
        if hf.endswith("in_proj_qkvz"):  # gguf-py still maps it to the legacy fused ssm_in; the converter splits it
            assert expected.endswith("ssm_in") and base.endswith(("attn_qkv", "attn_gate"))
        else:
            assert expected == base, source.hf_name
    assert len(tensors) == len(tensor_sources(model))


def test_qwen3next_layout_and_metadata(tmp_path):
    model, reader, tensors = _qwen3next_export(tmp_path, "Q8_0")
    layout = {name: (tuple(int(n) for n in reversed(t.shape)), t.tensor_type.name) for name, t in tensors.items()}
    gdn = {  # value heads 4 x 16, key heads 2 x 16: conv channels 2*32 + 64 = 128
        "attn_qkv.weight": ((128, 64), "Q8_0"), "attn_gate.weight": ((64, 64), "Q8_0"),
        "ssm_ba.weight": ((8, 64), "Q8_0"), "ssm_conv1d.weight": ((128, 4), "F32"), "ssm_dt.bias": ((4,), "F32"),
        "ssm_a": ((4,), "F32"), "ssm_norm.weight": ((16,), "F32"), "ssm_out.weight": ((64, 64), "Q8_0"),
    }
    attention = {
        "attn_q.weight": ((128, 64), "Q8_0"), "attn_k.weight": ((32, 64), "Q8_0"), "attn_v.weight": ((32, 64), "Q8_0"),
        "attn_output.weight": ((64, 64), "Q8_0"), "attn_q_norm.weight": ((16,), "F32"),
        "attn_k_norm.weight": ((16,), "F32"),
    }
    common = {
        "attn_norm.weight": ((64,), "F32"), "post_attention_norm.weight": ((64,), "F32"),
        "ffn_gate_inp.weight": ((8, 64), "F32"), "ffn_gate_exps.weight": ((8, 32, 64), "Q8_0"),
        "ffn_up_exps.weight": ((8, 32, 64), "Q8_0"), "ffn_down_exps.weight": ((8, 64, 32), "Q8_0"),
        "ffn_gate_shexp.weight": ((64, 64), "Q8_0"), "ffn_up_shexp.weight": ((64, 64), "Q8_0"),
        "ffn_down_shexp.weight": ((64, 64), "Q8_0"), "ffn_gate_inp_shexp.weight": ((1, 64), "F32"),
    }
    expected = {"token_embd.weight": ((512, 64), "Q8_0"), "output_norm.weight": ((64,), "F32"),
                "output.weight": ((512, 64), "Q8_0")}
    for i in range(4):
        for name, value in {**(attention if i % 2 else gdn), **common}.items():
            expected[f"blk.{i}.{name}"] = value
    assert layout == expected

    metadata = {key: f.contents() for key, f in reader.fields.items() if key.startswith("qwen3next.")}
    assert metadata == {
        "qwen3next.block_count": 4, "qwen3next.context_length": 256, "qwen3next.embedding_length": 64,
        "qwen3next.feed_forward_length": 128, "qwen3next.attention.head_count": 4,
        "qwen3next.attention.head_count_kv": 2, "qwen3next.attention.key_length": 16,
        "qwen3next.attention.value_length": 16, "qwen3next.rope.freq_base": 10000.0,
        "qwen3next.attention.layer_norm_rms_epsilon": pytest.approx(1e-6, rel=1e-7), "qwen3next.vocab_size": 512,
        "qwen3next.expert_count": 8, "qwen3next.expert_used_count": 2,
        "qwen3next.expert_feed_forward_length": 32, "qwen3next.expert_shared_feed_forward_length": 64,
        "qwen3next.rope.dimension_count": 8,  # head_dim 16 x partial_rotary_factor 0.5
        "qwen3next.ssm.conv_kernel": 4, "qwen3next.ssm.state_size": 16, "qwen3next.ssm.group_count": 2,
        "qwen3next.ssm.time_step_rank": 4, "qwen3next.ssm.inner_size": 64, "qwen3next.full_attention_interval": 2,
    }


def test_qwen3next_values_follow_llama_cpp_conversion(tmp_path):
    """(1 + w) norms baked in except the gated one, A = -exp(A_log), conv squeezed, qkvz split as transformers
    splits it at run time (its own fix_query_key_value_ordering is the oracle), ba unchanged."""
    model, _, tensors = _qwen3next_export(tmp_path)
    layers = model.model.layers

    def read(name):
        return torch.from_numpy(np.array(tensors[name].data))

    def hf(param):
        return param.detach()

    assert torch.equal(read("output_norm.weight"), hf(model.model.norm.weight) + 1)
    assert torch.equal(read("blk.3.attn_norm.weight"), hf(layers[3].input_layernorm.weight) + 1)
    assert torch.equal(read("blk.0.post_attention_norm.weight"), hf(layers[0].post_attention_layernorm.weight) + 1)
    assert torch.equal(read("blk.1.attn_k_norm.weight"), hf(layers[1].self_attn.k_norm.weight) + 1)
    gdn = layers[2].linear_attn
    assert torch.equal(read("blk.2.ssm_norm.weight"), hf(gdn.norm.weight))
    assert torch.equal(read("blk.2.ssm_a"), -torch.exp(hf(gdn.A_log)))
    assert torch.equal(read("blk.2.ssm_dt.bias"), hf(gdn.dt_bias))
    assert torch.equal(read("blk.2.ssm_conv1d.weight"), hf(gdn.conv1d.weight)[:, 0])
    assert torch.equal(read("blk.2.ssm_ba.weight"), hf(gdn.in_proj_ba.weight))
    assert torch.equal(read("blk.2.ffn_gate_inp_shexp.weight"), hf(layers[2].mlp.shared_expert_gate.weight))

    x = torch.randn(1, 3, 64)
    with torch.no_grad():
        q, k, v, z, _, _ = gdn.fix_query_key_value_ordering(gdn.in_proj_qkvz(x), gdn.in_proj_ba(x))
        qkv = x @ read("blk.2.attn_qkv.weight").T
        gate = x @ read("blk.2.attn_gate.weight").T
    torch.testing.assert_close(qkv, torch.cat([t.flatten(2) for t in (q, k, v)], dim=-1), rtol=0, atol=1e-5)
    torch.testing.assert_close(gate, z.flatten(2), rtol=0, atol=1e-5)


def test_qwen3next_quantized_round_trip(tmp_path):
    model, _, tensors = _qwen3next_export(tmp_path, "Q8_0")
    expected = dequantized_hf_model(model, "Q8_0")
    qkvz = expected.model.layers[0].linear_attn.in_proj_qkvz.weight.detach()
    original = model.model.layers[0].linear_attn.in_proj_qkvz.weight.detach()
    assert not torch.equal(qkvz, original) and (qkvz - original).abs().max() < 0.02
    stored = gguf.quants.dequantize(tensors["blk.0.attn_gate.weight"].data, gguf.GGMLQuantizationType.Q8_0)
    _, z_rows = _qkvz_rows(model.config)
    assert torch.equal(qkvz[list(z_rows)], torch.from_numpy(stored))


@pytest.mark.parametrize("overrides, message", [
    (dict(layer_types=["linear_attention", "full_attention", "full_attention", "linear_attention"]), "layer_types"),
    (dict(mlp_only_layers=[1]), "every layer MoE"),
    (dict(linear_value_head_dim=8), "head dims equal"),
])
def test_qwen3next_configs_llama_cpp_cannot_load_are_refused(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        export_gguf(make_hf_model("qwen3next", **overrides), tmp_path / "bad.gguf")


def test_qwen3next_mtp_block_is_written_under_nextn_names(tmp_path):
    """The checkpoint's mtp.* block lands on block n_layer under llama.cpp's nextn names, norms with their +1."""
    model = make_hf_model("qwen3next", seed=3, mtp=True)
    path = tmp_path / "mtp.gguf"
    export_gguf(model, path, "F32")
    reader = gguf.GGUFReader(path)
    n = model.config.num_hidden_layers
    assert reader.fields["qwen3next.block_count"].contents() == n + 1
    assert reader.fields["qwen3next.nextn_predict_layers"].contents() == 1
    tensors = {t.name: t for t in reader.tensors}
    known = set(gguf.TENSOR_NAMES.values())
    for name in (t for t in tensors if t.startswith(f"blk.{n}.")):
        assert re.sub(r"blk\.\d+\.", "blk.{bid}.", name.removesuffix(".weight")) in known, name
    params = dict(model.named_parameters())
    fc = np.asarray(tensors[f"blk.{n}.nextn.eh_proj.weight"].data)
    assert np.array_equal(fc, params["mtp.fc.weight"].detach().numpy())
    enorm = np.asarray(tensors[f"blk.{n}.nextn.enorm.weight"].data)
    assert np.allclose(enorm, 1 + params["mtp.pre_fc_norm_embedding.weight"].detach().numpy())
    assert f"blk.{n}.attn_q.weight" in tensors and f"blk.{n}.ffn_gate_exps.weight" in tensors
    assert f"blk.{n}.nextn.shared_head_norm.weight" in tensors and f"blk.{n}.attn_qkv.weight" not in tensors


def test_checkpoint_mtp_tensors_attach_with_experts_one_by_one():
    """A loaded Qwen3-Next has no mtp.*: the checkpoint's tensors (experts stored one by one) attach as the block."""
    from tools.export_hf import attach_checkpoint_mtp

    source = make_hf_model("qwen3next", seed=4, mtp=True)
    checkpoint = {}
    for name, param in source.mtp.named_parameters():
        if name.endswith("experts.gate_up_proj"):
            for e, (gate, up) in enumerate(zip(*param.detach().chunk(2, dim=1))):
                checkpoint[f"mtp.{name[:-len('gate_up_proj')]}{e}.gate_proj.weight"] = gate
                checkpoint[f"mtp.{name[:-len('gate_up_proj')]}{e}.up_proj.weight"] = up
        elif name.endswith("experts.down_proj"):
            for e, down in enumerate(param.detach()):
                checkpoint[f"mtp.{name[:-len('down_proj')]}{e}.down_proj.weight"] = down
        else:
            checkpoint[f"mtp.{name}"] = param.detach()
    model = make_hf_model("qwen3next", seed=4)
    attach_checkpoint_mtp(model, checkpoint)
    for name, param in source.mtp.named_parameters():
        assert torch.equal(dict(model.mtp.named_parameters())[name], param), name
    del checkpoint["mtp.norm.weight"]
    with pytest.raises(ValueError, match="lacks MTP tensors: mtp.norm.weight"):
        attach_checkpoint_mtp(make_hf_model("qwen3next", seed=4), checkpoint)
