"""The static decode step's one-launch kernels of session 6, taken on the CPU through Triton's interpreter as a GPU
takes them: the q/k norm + RoPE + KV write (StaticDenseKV / StaticPagedKV `attend_normed`,
kernels/pointwise/qk_norm_rope_store.py) gives the same logits, byte for byte, as the separate launches (norm + RoPE,
then the store); the MoE add + norm + router + top-k (kernels/pointwise/add_norm_route.py) the same tokens as the
three launches, in the resident step and in the segments of an expert cache."""

import os

import pytest
import torch

from strata.engine.engine import Engine, EngineConfig
from strata.engine.kv import KVBackend
from strata.engine.static_kv import StaticDenseKV, StaticPagedKV
from strata.kernels.pointwise import qk_norm_rope_store
from strata.models import layers

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="CPU tensors take Triton only interpreted")]
PROMPT = [5, 17, 99, 3]


@pytest.fixture(scope="module")
def tiny_moe_hd64(model_dir):
    """The tiny qwen3moe with heads of 64 values: what the int8 pool quantizes."""
    from strata.models.synthetic import make_model

    return make_model(model_dir / "tiny-qwen3moe-hd64.gguf", arch="qwen3moe", preset="tiny", quant="Q8_0",
                      head_dim=64, n_embd=128)


def _static_logits(path, kv_dtype: str, **options) -> torch.Tensor:
    layers.FUSED_ON_CPU = True
    try:
        engine = Engine(path, EngineConfig(device="cpu", dtype="bfloat16", kv_dtype=kv_dtype, decode_graphs="eager",
                                           **options))
        logits = engine.prefill(PROMPT)
        if kv_dtype == "int8":
            engine.kv.kernels = True  # the pool's Triton kernels, as on a GPU
        out = []
        for step in range(2):
            logits = engine.decode(int(logits[-1].argmax()), len(PROMPT) + step)
            out.append(logits.clone())
        assert engine.decoder is not None and engine.decoder.steps == 2
        return torch.cat(out)
    finally:
        layers.FUSED_ON_CPU = False


@pytest.mark.parametrize("kv_dtype,view", [("float16", StaticDenseKV), ("int8", StaticPagedKV)])
def test_one_launch_gives_the_bytes_of_the_separate_ones(tiny_moe_hd64, kv_dtype, view, monkeypatch):
    launches = []
    for name in ("qk_norm_rope_store_dense", "qk_norm_rope_store_paged"):
        real = getattr(qk_norm_rope_store, name)
        monkeypatch.setattr(f"strata.engine.static_kv.{name}",
                            lambda *a, real=real: launches.append(1) or real(*a))
    fused = _static_logits(tiny_moe_hd64, kv_dtype)
    assert launches  # the one-launch kernel ran
    monkeypatch.setattr(view, "attend_normed", KVBackend.attend_normed)  # norm + RoPE, then the view's attend
    separate = _static_logits(tiny_moe_hd64, kv_dtype)
    assert torch.equal(fused, separate)


@pytest.mark.parametrize("options", [dict(), dict(expert_cache=3)], ids=["resident", "cached-experts"])
def test_routing_in_one_launch_keeps_the_tokens(tiny_moe_hd64, options, monkeypatch):
    from strata import switches
    from strata.kernels.pointwise import add_norm_route

    launches = []
    real = add_norm_route.add_norm_route_triton
    monkeypatch.setattr(add_norm_route, "add_norm_route_triton", lambda *a, **k: launches.append(1) or real(*a, **k))
    fused = _static_logits(tiny_moe_hd64, "float16", **options)
    assert launches
    with switches.override(STRATA_ROUTE_SEPARATE=True):
        separate = _static_logits(tiny_moe_hd64, "float16", **options)
    assert torch.equal(fused.argmax(-1), separate.argmax(-1))
    # The logits' sums in another order than the router's matmul (and rounded by truncation here): a few bf16 steps.
    assert (fused - separate).abs().max() <= 3e-2 * separate.abs().max()


@pytest.fixture(scope="module")
def tiny_next(model_dir):
    from strata.models.synthetic import make_model

    return make_model(model_dir / "tiny-qwen3next-join.gguf", arch="qwen3next", preset="tiny", quant="Q8_0")


@pytest.mark.parametrize("options", [dict(), dict(expert_cache=3)], ids=["resident", "cached-experts"])
def test_shared_gate_add_norm_in_one_launch_gives_the_same_bytes(tiny_next, options, monkeypatch):
    from strata.kernels.pointwise import shared_gate_add_norm
    from strata.models import decoder

    launches = []
    real = shared_gate_add_norm.shared_gate_add_norm_triton
    monkeypatch.setattr(shared_gate_add_norm, "shared_gate_add_norm_triton",
                        lambda *a: launches.append(1) or real(*a))
    joined = _static_logits(tiny_next, "float16", **options)
    assert launches
    monkeypatch.setattr(decoder, "shared_gate_add_rms_norm", lambda *a: None)  # the gate kernel, then add + norm
    assert torch.equal(_static_logits(tiny_next, "float16", **options), joined)


@pytest.mark.parametrize("kv_dtype,store", [("float16", "qk_norm_rope_store_dense"),
                                             ("int8", "qk_norm_rope_store_paged")])
def test_the_turned_attention_gives_the_bytes_of_the_two_launches(tiny_moe_hd64, kv_dtype, store, monkeypatch):
    """STRATA_DECODE_TURN: the q/k norm + RoPE and the store inside the attention's launch (decode_turn.py), every
    layer of each step, the same logits as the store launch then the attention (under the interpreter the norms'
    sums run in the same order)."""
    from strata import switches

    separate = _static_logits(tiny_moe_hd64, kv_dtype)
    stores = []
    real = getattr(qk_norm_rope_store, store)
    monkeypatch.setattr(f"strata.engine.static_kv.{store}", lambda *a: stores.append(1) or real(*a))
    with switches.override(STRATA_DECODE_TURN=True):
        turned = _static_logits(tiny_moe_hd64, kv_dtype)
    assert not stores  # no layer of either step fell back to the store launch
    assert torch.equal(turned, separate)
