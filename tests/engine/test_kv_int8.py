"""KV backends by name: the dense cache unchanged (pinned hashes), the int8 paged cache close to it."""

from __future__ import annotations

import hashlib

import pytest
import torch

import strata
from strata.engine.context import ForwardContext
from strata.engine.kv import KVCache, kv_bytes_per_value, new_kv_cache
from strata.engine.kv_paged import PagedInt8KV
from strata.errors import StrataError
from strata.gguf.reader import GGUFModelFile
from strata.kernels.attention.kv_int8 import dequantize_int8, quantize_int8_ref
from strata.models import load_model
from strata.models.layers import attend
from strata.models.synthetic import make_model
from tests.kernels import DEVICE  # CUDA where there is one: the kernel tests below then run compiled

CPU = torch.device("cpu")
IDS = [(7 * i + 3) % 500 + 5 for i in range(64)]


def _tiny(model_dir, arch: str, head_dim: int):
    path = model_dir / f"kv-{arch}-hd{head_dim}.gguf"
    if path.exists():
        return path
    wide = dict(head_dim=64, n_embd=128) if head_dim == 64 else {}
    return make_model(path, arch=arch, preset="tiny", quant="Q8_0", **wide)


def _rel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-row error relative to the row's norm."""
    return (a - b).norm(dim=-1) / b.norm(dim=-1)


# ---------------------------------------------------------------------------------------------- the default


def _default_path_logits(path) -> torch.Tensor:
    """Prompt chunks, a shared-prefix reuse and two one-token steps, through the default (float16) KV cache."""
    engine = strata.LLM(path, device="cpu", prefill_chunk=8).engine
    ids = IDS[:20]
    out = [engine.logits(ids), engine.prefill(ids[:12]), engine.prefill(ids[:12] + [42]),
           engine.prefill(ids[:12] + [42, 17])]
    return torch.cat([o.cpu() for o in out])


# Obtained by running _default_path_logits on this machine's CPU torch at commit b278340 (before KV backends had
# names; the model files then wrote and read the cache themselves), so the default path's bytes are pinned. The bytes
# depend on torch's CPU kernels, so they are compared only on the torch CI installs (the GPU machine has another).
PINNED_TORCH = "2.13.0"
DEFAULT_HASHES = {
    "qwen3moe": "e85af36ef1ad95d261de82b8a7133337b331ae4e33a63ea4ca3274914a369175",
    "qwen3next": "114d87edc4c9df76f2a8ff26688b84e1203f6dcd3cc0be6ca59382e3c9ac2a0c",
}


@pytest.mark.parametrize("arch", sorted(DEFAULT_HASHES))
@pytest.mark.skipif(torch.__version__.split("+")[0] != PINNED_TORCH, reason=f"hashes recorded on torch {PINNED_TORCH}")
def test_the_default_kv_cache_gives_the_same_logit_bytes_as_before(model_dir, arch):
    logits = _default_path_logits(_tiny(model_dir, arch, 16))
    assert logits.shape == (23, 512)
    assert hashlib.sha256(logits.numpy().tobytes()).hexdigest() == DEFAULT_HASHES[arch]


# ---------------------------------------------------------------------------------------------- the registry


def test_backends_by_name_and_their_bytes():
    assert isinstance(new_kv_cache("float16", 2, 2, 64, 32, CPU), KVCache)
    assert new_kv_cache(torch.float32, 2, 2, 64, 32, CPU).dtype == torch.float32
    assert isinstance(new_kv_cache("int8", 2, 2, 64, 32, CPU), PagedInt8KV)
    assert [kv_bytes_per_value(k) for k in ("float16", "bfloat16", "float32", "int8")] == [2, 2, 4, 1 + 2 / 64]
    with pytest.raises(StrataError, match="kv_dtype 'int4' is not one of float16, bfloat16, float32, int8"):
        new_kv_cache("int4", 2, 2, 64, 32, CPU)


def test_int8_needs_head_dim_a_multiple_of_64(model_dir):
    path = _tiny(model_dir, "qwen3moe", 16)
    with pytest.raises(StrataError, match="kv_dtype int8 .* head_dim 16 is not a multiple of 64") as error:
        strata.LLM(path, device="cpu", kv_dtype="int8")
    assert "\n" not in str(error.value)


def test_placement_counts_int8_bytes(model_dir):
    path = _tiny(model_dir, "qwen3moe", 64)
    plans = {k: strata.LLM(path, device="cpu", kv_dtype=k, n_ctx=256).engine.plan for k in ("float16", "int8")}
    assert plans["int8"].kv_bytes == plans["float16"].kv_bytes * (1 + 2 / 64) / 2


# ---------------------------------------------------------------------------------------------- the paged cache


def test_paged_attention_is_attention_over_the_dequantized_cells():
    torch.manual_seed(0)
    n_heads, n_kv_heads, dim = 4, 2, 128
    cache = PagedInt8KV(1, n_kv_heads, dim, 64, CPU, initial_tokens=8)
    k, v = torch.randn(21, n_kv_heads, dim), torch.randn(21, n_kv_heads, dim)
    q = torch.randn(21, n_heads, dim)
    outs = []
    for start, end in ((0, 13), (13, 14), (14, 21)):  # a prompt chunk, a decode step, another chunk
        cache.reserve(end)
        outs.append(cache.attend(0, q[start:end], k[start:end], v[start:end], start))
    assert cache.n_pages >= 6 and len(cache.pages) == 6  # grown from 2 pages, 21 cells in 6 pages of 4
    kd, vd = (dequantize_int8(*quantize_int8_ref(x)) for x in (k, v))
    want = attend(q.double(), kd.double(), vd.double(), 0)
    assert (torch.cat(outs).double() - want).abs().max() < 1e-5


def test_paged_pages_come_back_on_truncate_and_a_prefix_stays():
    torch.manual_seed(1)
    cache = PagedInt8KV(2, 1, 64, 40, CPU, initial_tokens=4)
    k = torch.randn(30, 1, 64)
    q = torch.randn(30, 2, 64)
    cache.reserve(30)
    full = cache.attend(1, q, k, k, 0)
    kept = list(cache.pages[:3])
    cache.truncate(10)  # pages of cells 0..11 stay; cells 10, 11 are rewritten below
    assert cache.pages == kept and len(cache.free) == cache.n_pages - 3
    cache.reserve(30)
    again = cache.attend(1, q[10:], k[10:], k[10:], 10)
    assert torch.equal(again, full[10:])
    with pytest.raises(StrataError, match="41 tokens exceed the context size of 40"):
        cache.reserve(41)


# ---------------------------------------------------------------------------------------------- end to end
# Measured on the tiny models (head_dim 64, 64 tokens, prompt chunks of 16; error per row relative to its norm, int8
# against the float32 cache; bfloat16 KV beside it): qwen3 max 1.07e-2, mean 7.8e-3 (bf16 2.5e-3, 1.2e-3); qwen3moe
# mean 1.1e-2, max 8.4e-2 at one position, where int8 noise flips a near-tied expert choice; qwen3next mean 3.0e-3,
# max 5.9e-2, argmax agreement 96.9% (flips at margins below 2e-4).


@pytest.mark.parametrize("arch, max_rel, mean_rel", [("qwen3", 2e-2, 1e-2), ("qwen3moe", 1.5e-1, 2e-2),
                                                     ("qwen3next", 1e-1, 1e-2)])
def test_int8_logits_are_close_to_the_float_cache(model_dir, arch, max_rel, mean_rel):
    path = _tiny(model_dir, arch, 64)
    ref = strata.LLM(path, device="cpu", kv_dtype="float32", prefill_chunk=16).logits(IDS)
    int8 = strata.LLM(path, device="cpu", kv_dtype="int8", prefill_chunk=16).logits(IDS)
    rel = _rel(int8, ref)
    assert rel.max() < max_rel and rel.mean() < mean_rel, (rel.max(), rel.mean())
    assert (int8.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.95


@pytest.mark.parametrize("arch", ["qwen3", "qwen3next"])
def test_int8_prompt_chunks_and_one_token_steps_agree(model_dir, arch):
    path = _tiny(model_dir, arch, 64)
    ids = IDS[:24]
    whole = strata.LLM(path, device="cpu", kv_dtype="int8").logits(ids)
    chunked = strata.LLM(path, device="cpu", kv_dtype="int8", prefill_chunk=5).logits(ids)
    engine = strata.LLM(path, device="cpu", kv_dtype="int8").engine
    steps = torch.cat([engine.prefill(ids[: n + 1]) for n in range(len(ids))])  # each call: one new token
    assert _rel(chunked, whole).max() < 1e-5  # measured 5.6e-7
    assert _rel(steps, whole).max() < 1e-5  # measured 8.3e-7


def test_int8_prefix_reuse_equals_a_fresh_prompt(model_dir):
    path = _tiny(model_dir, "qwen3moe", 64)
    llm = strata.LLM(path, device="cpu", kv_dtype="int8")
    a, b = IDS[:30], IDS[:9] + IDS[40:50]
    llm.engine.prefill(a)
    pages = len(llm.engine.kv.pages)
    reused = llm.engine.prefill(b)  # rewinds the pages to the 9 shared tokens, then writes the rest
    assert llm.engine.cached_tokens == b and pages == 8 and len(llm.engine.kv.pages) == 5
    fresh = strata.LLM(path, device="cpu", kv_dtype="int8").engine.prefill(b)
    assert _rel(reused, fresh).max() < 1e-3


def test_qwen3next_generates_with_int8_kv(model_dir):
    path = _tiny(model_dir, "qwen3next", 64)
    out = strata.LLM(path, device="cpu", kv_dtype="int8").generate(IDS[:8], max_tokens=6, temperature=0)
    assert len(out.token_ids) == 6


# ---------------------------------------------------------------------------------------------- the GPU path


def test_the_kernels_write_the_same_pool_and_attend_alike():
    """The Triton kernels (compiled on a GPU, through the interpreter here) against the torch references: the same
    pool bytes, attention within fp32 rounding (measured on the CPU: 6e-7 of outputs up to 2.7)."""
    torch.manual_seed(0)
    k, v, q = (torch.randn(21, heads, 128).to(DEVICE) for heads in (2, 2, 4))
    runs = {}
    for kernels in (False, True):
        cache = PagedInt8KV(1, 2, 128, 64, torch.device(DEVICE), initial_tokens=8, kernels=kernels)
        outs = []
        for start, end in ((0, 13), (13, 14), (14, 21)):
            cache.reserve(end)
            outs.append(cache.attend(0, q[start:end], k[start:end], v[start:end], start))
        pool = cache.pools[0]
        runs[kernels] = torch.cat(outs), (pool.k, pool.v, pool.k_scale, pool.v_scale)
    assert all(torch.equal(a, b) for a, b in zip(runs[False][1], runs[True][1]))
    assert (runs[True][0] - runs[False][0]).abs().max() < 1e-5


def test_a_model_runs_the_int8_kernels(model_dir):
    path = _tiny(model_dir, "qwen3", 64)
    model = load_model(GGUFModelFile(path), torch.device(DEVICE), torch.float32)
    ids = torch.tensor(IDS[:12], device=DEVICE)
    logits = {}
    for kernels in (False, True):
        cache = model.new_cache(64, "int8")
        cache.kernels = kernels
        first = model.forward(ids[:11], ForwardContext(cache, 0, 11, want_all_logits=True))
        logits[kernels] = torch.cat((first, model.forward(ids[11:], ForwardContext(cache, 11, 1)))).cpu()
    assert _rel(logits[True], logits[False]).max() < 1e-5  # measured on the CPU: 4.2e-7
