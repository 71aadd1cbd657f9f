"""Model architectures by GGUF `general.architecture` name."""

from __future__ import annotations

import importlib

import torch

from strata.errors import StrataError
from strata.gguf.reader import GGUFModelFile
from strata.models.config import ModelConfig

# Imported on first use: the model modules import the engine's expert backends, which import model weights.
ARCHITECTURES = {
    "qwen2": "decoder:DecoderLM",
    "qwen3": "decoder:DecoderLM",
    "qwen3moe": "decoder:DecoderLM",
    "qwen2moe": "decoder:DecoderLM",
    "qwen3next": "qwen3next:Qwen3NextLM",
    "qwen4exp": "qwen4exp:Qwen4ExpLM",
}


def model_class(arch: str):
    module, name = ARCHITECTURES[arch].split(":")
    return getattr(importlib.import_module(f"strata.models.{module}"), name)


def config_of(model: GGUFModelFile) -> ModelConfig:
    arch = model.architecture
    if arch not in ARCHITECTURES:
        raise StrataError(f"{model.path}: unsupported architecture '{arch}' (supported: {', '.join(sorted(ARCHITECTURES))})")
    return ModelConfig.from_gguf(model)


def load_model(model: GGUFModelFile, device: torch.device, dtype: torch.dtype, progress: bool = False, **placement):
    """`placement` may name an `expert_device` for the routed experts (the host, when they are offloaded), or a
    `split` (engine/placement_split.LayerSplit) placing each layer on its card."""
    config = config_of(model)
    return model_class(config.arch)(config, model, device, dtype, progress=progress, **placement)
