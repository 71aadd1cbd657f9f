"""The resident backend's hand-off to the Triton expert kernels, checked on the CPU through the kernels' own torch
references (the kernels themselves are checked against float64 in tests/kernels/moe, on CPU and on the GPU)."""

import pytest
import torch

import strata
from strata.engine.experts import ResidentExperts, kernel_path, run_kernels
from strata.models.layers import route_topk
from strata.models.synthetic import make_model


@pytest.fixture(scope="module")
def layer_inputs(tmp_path_factory):
    path = make_model(tmp_path_factory.mktemp("glue") / "m.gguf", preset="tiny", quant="Q8_0", n_embd=128, expert_ff=64)
    model = strata.LLM(path, device="cpu").engine.model
    stack = model.expert_stacks[0]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 128, generator=g)
    weights, ids = route_topk(torch.randn(40, model.config.n_experts, generator=g), model.config.n_experts_used, True)
    reference = ResidentExperts(model.expert_stacks).run(0, x, weights, ids)
    return stack, x, weights, ids, reference


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def test_cpu_and_float32_keep_the_reference_loop(layer_inputs):
    stack, x, *_ = layer_inputs
    assert kernel_path(stack, x) is None  # on the CPU
    assert kernel_path(stack, x.bfloat16()) is None  # still the CPU


def test_decode_hand_off_equals_the_loop(layer_inputs):
    stack, x, weights, ids, reference = layer_inputs
    got = run_kernels("decode", stack, x[:4], weights[:4], ids[:4])
    assert _rel(got, reference[:4]) < 1e-5  # float32 math on exactly decoded weights


def test_prompt_hand_off_equals_the_loop_within_int8_rounding(layer_inputs):
    stack, x, weights, ids, reference = layer_inputs
    got = run_kernels("prompt", stack, x, weights, ids)
    assert _rel(got, reference) < 3e-2  # activations and H rounded to int8 per 32 values (the default mmq path)


def test_cached_hits_through_the_slot_kernel_equal_the_loop(tmp_path):
    """Cache hits in one GEMV over the slots (misses marked -1 add nothing) equal the per-expert loop on them."""
    from strata.engine.experts import accumulate, routed_tokens

    path = make_model(tmp_path / "m.gguf", preset="tiny", quant="Q8_0", n_embd=128, expert_ff=64)
    llm = strata.LLM(path, device="cpu", expert_cache=5)
    backend = llm.engine.model.experts
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 128, generator=g)
    weights, ids = route_topk(torch.randn(3, llm.config.n_experts, generator=g), llm.config.n_experts_used, True)
    layer = next(iter(backend.host_stacks))
    routes = routed_tokens(ids)
    hits = {e: s for (l, e), s in backend.cache.slot_of.items() if l == layer and e in routes}
    assert hits and len(hits) < len(routes)  # some hits, some misses
    expected = torch.zeros_like(x)
    accumulate(expected, routes, weights, x, lambda e: backend.cache.expert_weights(layer, hits[e]), hits)
    got = backend.hits_by_kernel(layer, x, weights, ids, hits)
    assert _rel(got, expected) < 1e-5
