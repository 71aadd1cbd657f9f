"""A tiny qwen4exp's chunked prompt over the fp16 KV cache, its QSA layers selecting (top_k 8: past 11 cells): the
selected-cells kernel (under the interpreter without a GPU) gives the next-token logits of the dense-mask SDPA
within 1e-3 relative, and the switch STRATA_QSA_DENSE_MASK=1 gives the old path's bytes."""

import dataclasses

import pytest
import torch

import strata.kernels  # noqa: F401  (the interpreter switch, before Triton is imported)
from strata import switches
from strata.engine.engine import Engine, EngineConfig
from strata.engine.kv import KVCache
from strata.models.synthetic import make_model
from tests.kernels import DEVICE

PROMPT = [(i * 37 + 5) % 500 for i in range(40)]  # chunks of 16: each ends past 11 cells, so each selects
SELECTED_KERNEL = KVCache.selected_kernel

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("qsa-kernel") / "tiny.gguf", arch="qwen4exp", preset="tiny",
                      quant="F32")


def _prompt_logits(path, kernels: bool, monkeypatch, dtype: str) -> tuple[torch.Tensor, list]:
    """Next-token logits after PROMPT in chunks of 16, and every selection's attention call that took the kernel."""
    monkeypatch.setattr(KVCache, "kernels", kernels)
    used = []
    monkeypatch.setattr(KVCache, "selected_kernel", lambda self, q: used.append(SELECTED_KERNEL(self, q)) or used[-1])
    engine = Engine(path, EngineConfig(device=DEVICE, kv_dtype="float16", prefill_chunk=16, dtype=dtype))
    engine.model.qsa = dataclasses.replace(engine.model.qsa, top_k=8)  # the selection starts past 11 cells
    return engine.prefill(PROMPT), used


# float32 activations: within 1e-3 (6.5e-6 measured on the CPU: the chunk's own keys rounded to fp16 as stored);
# bfloat16: 1e-2, since the old path also rounds the cached past keys to bf16 (2^-9 each), the kernel does not.
@pytest.mark.parametrize("dtype, bound", [("float32", 1e-3), ("bfloat16", 1e-2)])
def test_kernel_logits_within_1e3_of_the_dense_mask(tiny, monkeypatch, dtype, bound):
    old, used_old = _prompt_logits(tiny, False, monkeypatch, dtype)
    new, used_new = _prompt_logits(tiny, True, monkeypatch, dtype)
    assert used_new and all(used_new) and not any(used_old)  # the QSA layer selected in each chunk
    assert (new - old).abs().max() <= bound * old.abs().max()
    with switches.override(STRATA_QSA_DENSE_MASK=True):
        opted_out, used = _prompt_logits(tiny, True, monkeypatch, dtype)
    assert not any(used) and torch.equal(opted_out, old)


def test_the_chunk_rule_budgets_no_context_wide_mask_where_the_kernel_attends(tiny, monkeypatch):
    """Prompt chunks over the fp16 cache budget a [chunk, context] mask only where something builds one: with the
    selected-cells kernel, at most the selection's width (the dense phase below it); else the whole context."""
    engine = Engine(tiny, EngineConfig(device="cpu", kv_dtype="float16", n_ctx=4096))
    cells = engine.model.qsa.selection_cells
    assert engine._mask_context("float16", 1) == 4096 and engine._mask_context("int8", 1) == 0  # CPU: SDPA
    monkeypatch.setattr(KVCache, "kernels", True)
    assert engine._mask_context("float16", 1) == cells < 4096
    assert engine._mask_context("float16", 2) == 4096  # speculation's MTP catch-up attends densely
    with switches.override(STRATA_QSA_DENSE_MASK=True):
        assert engine._mask_context("float16", 1) == 4096


def test_the_plan_budgets_the_masks_the_engine_budgets(tiny, monkeypatch):
    """`strata info --plan` (no model loaded) gives the engine's mask width: the selection's on a GPU's fp16 cache,
    the whole context on the CPU, with STRATA_QSA_DENSE_MASK or for another cache dtype; none for int8."""
    from strata.gguf.reader import GGUFModelFile
    from strata.models.info import _mask_context

    engine = Engine(tiny, EngineConfig(device="cpu", kv_dtype="float16", n_ctx=4096))
    file, config = GGUFModelFile(tiny), engine.model.config
    monkeypatch.setattr(KVCache, "kernels", True)  # the engine as on a GPU
    assert _mask_context(file, config, 4096, "float16", True) == engine._mask_context("float16", 1) < 4096
    assert _mask_context(file, config, 4096, "float16", False) == 4096
    assert _mask_context(file, config, 4096, "int8", True) == 0
    assert _mask_context(file, config, 4096, "bfloat16", True) == 4096
    with switches.override(STRATA_QSA_DENSE_MASK=True):
        assert _mask_context(file, config, 4096, "float16", True) == engine._mask_context("float16", 1) == 4096
