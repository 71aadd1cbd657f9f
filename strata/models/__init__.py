"""Model architectures by GGUF `general.architecture` name."""

from __future__ import annotations

import torch

from strata.errors import StrataError
from strata.gguf.reader import GGUFModelFile
from strata.models.config import ModelConfig
from strata.models.decoder import DecoderLM

ARCHITECTURES = {"qwen2": DecoderLM, "qwen3": DecoderLM, "qwen3moe": DecoderLM, "qwen2moe": DecoderLM}


def config_of(model: GGUFModelFile) -> ModelConfig:
    arch = model.architecture
    if arch not in ARCHITECTURES:
        raise StrataError(f"{model.path}: unsupported architecture '{arch}' (supported: {', '.join(sorted(ARCHITECTURES))})")
    return ModelConfig.from_gguf(model)


def load_model(model: GGUFModelFile, device: torch.device, dtype: torch.dtype, progress: bool = False) -> DecoderLM:
    config = config_of(model)
    return ARCHITECTURES[config.arch](config, model, device, dtype, progress=progress)
