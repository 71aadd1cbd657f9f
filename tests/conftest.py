"""Shared fixtures: tiny models made on the fly by the project's own tools, once per test session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # tools/ (the transformers exporter) lives beside the package


@pytest.fixture(scope="module")
def one_torch_thread():
    """For a module of tiny models (`pytestmark = pytest.mark.usefixtures("one_torch_thread")`): tiny tensors gain
    nothing from intra-op threads, and on a shared 2-core machine their spinning costs seconds (~40x)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tiny_moe(model_dir) -> Path:
    """A synthetic qwen3moe model (tiny preset, Q8_0) with a trained 512-token BPE vocabulary."""
    from strata.models.synthetic import make_model

    return make_model(model_dir / "tiny-qwen3moe-q8_0.gguf", arch="qwen3moe", preset="tiny", quant="Q8_0")


@pytest.fixture(scope="session")
def tiny_llm(tiny_moe):
    import strata

    return strata.LLM(tiny_moe, device="cpu")


class HFExports:
    """transformers models written to GGUF (with a tokenizer), cached per (arch, qtype, tied)."""

    def __init__(self, root: Path):
        self.root, self.cache = root, {}

    def get(self, arch: str, qtype: str = "F32", tied: bool = False):
        key = (arch, qtype, tied)
        if key not in self.cache:
            from strata.tokenizer_train import train_small_bpe
            from tools.export_hf import K_QUANT_SIZES, export_gguf, make_hf_model

            sizes = K_QUANT_SIZES if qtype in ("Q4_K", "Q2_0") else {}  # rows of whole blocks
            model = make_hf_model(arch, seed=7, tie_word_embeddings=tied, **sizes)
            path = self.root / f"{arch}-{qtype}{'-tied' if tied else ''}.gguf"
            export_gguf(model, path, qtype, tokenizer_metadata=train_small_bpe(model.config.vocab_size))
            self.cache[key] = (model, path)
        return self.cache[key]


@pytest.fixture(scope="session")
def hf_exports(model_dir) -> HFExports:
    return HFExports(model_dir)
