"""qwen3next against transformers' Qwen3NextForCausalLM on exported tiny models, and its cache and bad-file errors."""

import numpy as np
import pytest
import torch

import strata
from strata.engine.context import ForwardContext
from strata.engine.hybrid_cache import HybridCache
from strata.engine.kv import KVCache
from strata.errors import StrataError
from strata.gguf.reader import GGUFModelFile
from strata.gguf.writer import TensorSpec, write_gguf
from strata.models import load_model
from tools.export_hf import dequantized_hf_model

ARCH = "qwen3next"
N_TOKENS = 64


def _tokens(n: int, seed: int = 0, vocab: int = 512) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _relative_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours - ref).abs().max() / ref.abs().max()).item()


def _reference_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


@pytest.mark.parametrize("tied", [False, True])
def test_f32_logits_match_transformers(hf_exports, tied):
    model, path = hf_exports.get(ARCH, "F32", tied)
    ids = _tokens(N_TOKENS)
    ours = strata.LLM(path, device="cpu").logits(ids)
    ref = _reference_logits(model, ids)
    assert ours.shape == ref.shape == (N_TOKENS, 512)
    assert _relative_error(ours, ref) < 1e-4
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def test_q8_0_logits_match_transformers_on_the_dequantized_weights(hf_exports):
    model, path = hf_exports.get(ARCH, "Q8_0")
    ids = _tokens(N_TOKENS, seed=1)
    ours = strata.LLM(path, device="cpu").logits(ids)
    ref = _reference_logits(dequantized_hf_model(model, "Q8_0"), ids)
    assert _relative_error(ours, ref) < 1e-4
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))
    assert _relative_error(ours, _reference_logits(model, ids)) > 10 * _relative_error(ours, ref)


@pytest.mark.parametrize("prompt_len", [5, 40])  # prompt by the recurrent form / by the chunked form
def test_greedy_generation_matches_transformers(hf_exports, prompt_len):
    """Prompt, then one token at a time carrying conv and recurrent states, against transformers' generate."""
    model, path = hf_exports.get(ARCH, "F32")
    prompt = _tokens(prompt_len, seed=3)
    ours = strata.LLM(path, device="cpu", kv_dtype="float32").generate(prompt, max_tokens=24, temperature=0).token_ids
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
    theirs = out[0, prompt_len:].tolist()
    assert len(ours) >= 8 and ours == theirs[: len(ours)]


def test_prompt_in_small_steps_equals_one_pass(hf_exports):
    """States and keys carried across engine steps of 7 tokens (chunked and recurrent forms mixed)."""
    _, path = hf_exports.get(ARCH, "F32")
    ids = _tokens(50, seed=4)
    whole = strata.LLM(path, device="cpu", kv_dtype="float32").logits(ids)
    steps = strata.LLM(path, device="cpu", kv_dtype="float32", prefill_chunk=7).logits(ids)
    assert _relative_error(steps, whole) < 1e-5


def test_prompt_reuse_continues_or_starts_over(hf_exports):
    _, path = hf_exports.get(ARCH, "F32")
    llm = strata.LLM(path, device="cpu", kv_dtype="float32")
    a, b = _tokens(20, seed=5), _tokens(20, seed=6)
    fresh = {name: strata.LLM(path, device="cpu", kv_dtype="float32").engine.prefill(ids)
             for name, ids in (("a", a), ("a+", a + b[:5]), ("b", b))}
    engine = llm.engine
    assert torch.equal(engine.prefill(a), fresh["a"])
    assert torch.allclose(engine.prefill(a + b[:5]), fresh["a+"], rtol=0, atol=1e-5)  # continues the states
    assert engine.kv.length == 25
    assert torch.allclose(engine.prefill(b), fresh["b"], rtol=0, atol=1e-5)  # cannot rewind: starts over
    assert engine.kv.length == 20
    # logits() always reads from position 0, whatever the cache held
    assert torch.allclose(llm.logits(a)[-1], fresh["a"][-1], rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------------------------- the cache


def _cache(**changes):
    args = dict(recurrent_layers=(True, False, True, False), n_kv_heads=2, head_dim=16, conv_shape=(3, 128),
                state_shape=(4, 16, 16), max_tokens=32, kv_dtype=torch.float32, conv_dtype=torch.float32,
                device=torch.device("cpu"))
    return HybridCache(**{**args, **changes})


def test_hybrid_cache_keeps_kv_for_attention_layers_and_states_for_the_others():
    cache = _cache()
    assert cache.kv.n_layers == 2 and sorted(cache.state) == sorted(cache.conv) == [0, 2]
    assert cache.state[0].dtype == torch.float32 and cache.n_bytes > cache.kv.n_bytes
    cache.begin(0, 5)
    cache.write(3, 0, torch.ones(5, 2, 16), torch.ones(5, 2, 16))
    cache.state[2].fill_(1.0)
    keys, _ = cache.read(3, 5, torch.float32)
    assert torch.equal(keys, torch.ones(5, 2, 16)) and not cache.can_truncate
    cache.truncate(5)  # keeping everything is fine
    assert cache.length == 5 and cache.state[2].sum() > 0
    with pytest.raises(StrataError, match="cannot be rewound from 5 to 3"):
        cache.truncate(3)
    with pytest.raises(StrataError, match="holds 5 tokens and cannot continue at position 7"):
        cache.begin(7, 1)
    cache.begin(5, 1)
    cache.truncate(0)
    assert cache.length == 0 and cache.state[2].sum() == 0


@pytest.mark.parametrize("changes, message", [
    (dict(state_shape=(2, 16, 16)), r"recurrent state has shape \[2, 16, 16\], the model needs \[4, 16, 16\]"),
    (dict(conv_shape=(2, 128)), r"conv state has shape \[2, 128\], the model needs \[3, 128\]"),
    (dict(recurrent_layers=(True, True, True, False)), "layer pattern RRRA is not the model's RARA"),
])
def test_a_cache_of_the_wrong_shape_is_refused(hf_exports, changes, message):
    _, path = hf_exports.get(ARCH, "F32")
    model = load_model(GGUFModelFile(path), torch.device("cpu"), torch.float32)
    assert model.new_cache(32, torch.float32).state_shape == (4, 16, 16)
    with pytest.raises(StrataError, match=message) as error:
        model.forward(torch.tensor([1, 2]), ForwardContext(_cache(**changes), 0, 2))
    assert "\n" not in str(error.value) and str(path) in str(error.value)
    plain = KVCache(4, 2, 16, 32, torch.float32, torch.device("cpu"))
    with pytest.raises(StrataError, match="needs the HybridCache of new_cache"):
        model.forward(torch.tensor([1, 2]), ForwardContext(plain, 0, 2))


# ---------------------------------------------------------------------------------------------- files


def _rewrite(src, dst, metadata=None, drop=(), extra=()):
    """A copy of GGUF `src` with metadata keys changed (None deletes), tensors dropped or added."""
    model = GGUFModelFile(src)
    meta = {k: v for k, v in {**model.metadata, **(metadata or {})}.items() if v is not None}
    specs = [TensorSpec(t.name, t.shape, t.ggml_type, lambda t=t: np.array(t.data))
             for t in model.tensors.values() if t.name not in drop]
    write_gguf(dst, model.architecture, meta, [*specs, *extra])
    return dst


def _f32(name, shape, seed=0):
    values = np.random.default_rng([seed, *name.encode()]).standard_normal(shape).astype(np.float32) * 0.1
    return TensorSpec(name, tuple(shape), 0, lambda: values)


@pytest.mark.parametrize("metadata, drop, extra, message", [
    # layer 1 holds attention tensors; an interval of 3 makes it GatedDeltaNet
    ({"qwen3next.full_attention_interval": 3}, (), (),
     r"tensor blk\.1\.attn_q\.weight does not belong in layer 1, which is a GatedDeltaNet layer by "
     r"qwen3next\.full_attention_interval=3"),
    ({"qwen3next.attention.recurrent_layers": [True, False, True, True]}, (), (),
     r"tensor blk\.3\.attn_q\.weight does not belong in layer 3, .*attention\.recurrent_layers"),
    ({"qwen3next.attention.recurrent_layers": [True, False, True]}, (), (),
     r"metadata field qwen3next\.attention\.recurrent_layers must list 4 layers"),
    ({"qwen3next.full_attention_interval": 0}, (), (), "full_attention_interval must be at least 1"),
    ({"qwen3next.ssm.group_count": 3}, (), (), r"ssm\.time_step_rank 4 value heads must be a multiple"),
    ({"qwen3next.ssm.conv_kernel": 0}, (), (), r"qwen3next\.ssm\.conv_kernel must be positive"),
    ({"qwen3next.ssm.inner_size": None}, (), (), "needs the ssm.* metadata fields"),
    ({"qwen3next.rope.dimension_count": 20}, (), (), "rope.dimension_count 20 is not an even number"),
    ({}, ("blk.2.ssm_conv1d.weight",), (_f32("blk.2.ssm_conv1d.weight", (128, 3)),),
     r"tensor blk\.2\.ssm_conv1d\.weight has shape \[128, 3\], expected \[128, 4\]"),
    ({}, ("blk.0.ssm_a",), (), r"tensor blk\.0\.ssm_a is missing"),
])
def test_bad_files_name_the_field_or_tensor(hf_exports, tmp_path, metadata, drop, extra, message):
    _, path = hf_exports.get(ARCH, "F32")
    bad = _rewrite(path, tmp_path / "bad.gguf", metadata, drop, extra)
    with pytest.raises(StrataError, match=message) as error:
        strata.LLM(bad, device="cpu")
    assert "\n" not in str(error.value) and "bad.gguf" in str(error.value)


def test_legacy_fused_ssm_in_reads_as_the_split_tensors(hf_exports, tmp_path):
    """A file with in_proj_qkvz unsplit (ssm_in, as older converters wrote it) gives the same logits."""
    model, path = hf_exports.get(ARCH, "F32")
    recurrent = [i for i, t in enumerate(model.config.layer_types) if t == "linear_attention"]
    fused = [TensorSpec(f"blk.{i}.ssm_in.weight", (192, 64), 0,
                        lambda i=i: model.model.layers[i].linear_attn.in_proj_qkvz.weight.detach().numpy())
             for i in recurrent]
    drop = [f"blk.{i}.attn_{x}.weight" for i in recurrent for x in ("qkv", "gate")]
    legacy = _rewrite(path, tmp_path / "legacy.gguf", drop=drop, extra=fused)
    ids = _tokens(20, seed=10)
    assert torch.equal(strata.LLM(legacy, device="cpu").logits(ids), strata.LLM(path, device="cpu").logits(ids))


def _with_mtp_block(path, dst):
    """The file plus one MTP block (blk.4, nextn_predict_layers = 1) made of layer 3's tensors and nextn ones."""
    model = GGUFModelFile(path)
    copied = [TensorSpec(t.name.replace("blk.3.", "blk.4."), t.shape, t.ggml_type, lambda t=t: np.array(t.data))
              for t in model.tensors.values() if t.name.startswith("blk.3.")]
    nextn = [_f32("blk.4.nextn.eh_proj.weight", (64, 128)), _f32("blk.4.nextn.enorm.weight", (64,)),
             _f32("blk.4.nextn.hnorm.weight", (64,)), _f32("blk.4.nextn.shared_head_norm.weight", (64,))]
    return _rewrite(path, dst, {"qwen3next.block_count": 5, "qwen3next.nextn_predict_layers": 1},
                    extra=[*copied, *nextn])


def test_mtp_block_is_loaded_and_leaves_the_logits_alone(hf_exports, tmp_path):
    _, path = hf_exports.get(ARCH, "F32")
    with_mtp = strata.LLM(_with_mtp_block(path, tmp_path / "mtp.gguf"), device="cpu")
    model = with_mtp.engine.model
    assert len(model.mtp) == 1 and model.n_main == 4 and model.mtp[0].eh_proj.shape == (64, 128)
    assert model.mtp[0].shared_head_norm is not None and 4 in model.expert_stacks
    ids = _tokens(16, seed=8)
    assert torch.equal(with_mtp.logits(ids), strata.LLM(path, device="cpu").logits(ids))


def test_synthetic_model_decodes_as_its_prompt_path_reads(tmp_path):
    """`strata make-model --arch qwen3next`: greedy decode through the carried states picks, at every step, the
    argmax of the prompt path run over the whole sequence so far."""
    from strata.models.synthetic import make_model

    path = make_model(tmp_path / "tiny-qwen3next.gguf", arch="qwen3next", preset="tiny", quant="Q8_0")
    llm = strata.LLM(path, device="cpu", kv_dtype="float32")
    assert llm.config.recurrent_layers == (True, False) and llm.config.rope_dim == 4
    prompt = _tokens(20, seed=9)
    generated = llm.generate(prompt, max_tokens=6, temperature=0).token_ids
    logits = llm.logits(prompt + generated[:-1])
    assert logits[len(prompt) - 1:].argmax(-1).tolist() == generated
