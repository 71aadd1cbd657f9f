"""`--max-context 524288`: nothing is sized by the context up front. An engine with the largest context runs a prompt
with the bytes of a small-context engine, its caches sized by the prompt; the plan counts the KV of the context."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import strata
from strata.engine.kv import kv_bytes_per_value
from strata.engine.placement import cache_bytes
from strata.errors import StrataError
from strata.models.synthetic import make_model

MAX = 524_288
IDS = [(7 * i + 3) % 500 + 5 for i in range(20)]


@pytest.fixture(scope="module")
def tiny_next(model_dir):
    path = model_dir / "long-qwen3next-hd64.gguf"
    return path if path.exists() else make_model(path, arch="qwen3next", preset="tiny", quant="Q8_0", head_dim=64,
                                                 n_embd=128)


@pytest.mark.parametrize("options", [dict(kv_dtype="float16"), dict(kv_dtype="int8"),
                                     dict(kv_dtype="int8", qsa="quest", kv_resident=4096)])
def test_the_largest_context_runs_a_prompt_like_a_small_one(tiny_next, options):
    big = strata.LLM(tiny_next, device="cpu", n_ctx=MAX, **options)
    small = strata.LLM(tiny_next, device="cpu", n_ctx=64, **options)
    assert big.engine.n_ctx == MAX
    assert torch.equal(big.logits(IDS), small.logits(IDS))
    assert big.engine.kv.n_bytes < 4 * 2**20  # the caches grew to the prompt, not the context (the context: 0.3 GiB)
    want = cache_bytes(big.config, MAX, kv_bytes_per_value(options["kv_dtype"]))
    if "kv_resident" in options:
        assert big.engine.plan.host_kv_bytes == want - cache_bytes(big.config, 0, kv_bytes_per_value("int8"))
        want = cache_bytes(big.config, 4096, kv_bytes_per_value("int8"))
    assert big.engine.plan.kv_bytes == want


def test_a_context_past_the_largest_is_refused(tiny_next):
    with pytest.raises(StrataError, match="n_ctx must be in 1..524288, got 524289"):
        strata.LLM(tiny_next, device="cpu", n_ctx=MAX + 1)


def test_info_plans_the_kv_of_the_context(tiny_next):
    run = subprocess.run([sys.executable, "-m", "strata", "info", str(tiny_next), "--plan", "--device", "cpu",
                          "--max-context", str(MAX), "--kv-dtype", "int8", "--kv-resident", "65536"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    # tiny qwen3next: 1 attention layer of 2 KV heads x 64, so 2 x 524288 x 128 x (1 + 2/64) bytes = 0.129 GiB.
    assert "KV cache       0.129 GiB (int8)" in run.stdout
    assert "placement plan (int8 KV, 65536 cells per layer on the device)" in run.stdout
    assert "KV in host       0.129 GiB: every page" in run.stdout


def test_prompt_chunks_leave_room_for_the_dense_caches_mask(tiny_next):
    from strata.engine.prefill import MASK_BYTES_PER_CELL, activation_bytes_per_token, chunk_size
    from strata.gguf.reader import GGUFModelFile
    from strata.models import config_of

    config = config_of(GGUFModelFile(tiny_next))
    free = 2 * 2**30
    paged = chunk_size("auto", config, on_gpu=True, free_bytes=free)
    dense = chunk_size("auto", config, on_gpu=True, free_bytes=free, mask_context=MAX)
    assert paged == 8192  # the paged cache's ids are bounded per call: the chunk is not cut for the context
    assert dense == free // 2 // (activation_bytes_per_token(config) + MASK_BYTES_PER_CELL * MAX) == 408
