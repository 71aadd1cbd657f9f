"""Model architectures by GGUF `general.architecture` name."""

from __future__ import annotations

import torch

from strata.errors import StrataError
from strata.gguf.reader import GGUFModelFile
from strata.models.config import ModelConfig
from strata.models.decoder import DecoderLM

ARCHITECTURES = {"qwen2": DecoderLM, "qwen3": DecoderLM, "qwen3moe": DecoderLM, "qwen2moe": DecoderLM}


def load_model(model: GGUFModelFile, device: torch.device, dtype: torch.dtype, progress: bool = False) -> DecoderLM:
    arch = model.architecture
    if arch not in ARCHITECTURES:
        raise StrataError(f"{model.path}: unsupported architecture '{arch}' (supported: {', '.join(sorted(ARCHITECTURES))})")
    config = ModelConfig.from_gguf(model)
    return ARCHITECTURES[arch](config, model, device, dtype, progress=progress)
