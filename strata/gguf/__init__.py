"""GGUF files: memory-mapped reading (split files as one), writing, and per-architecture tensor names."""

from strata.gguf.ggml_types import Q2_0, register_q2_0
from strata.gguf.reader import GGUFModelFile, TensorInfo

__all__ = ["GGUFModelFile", "TensorInfo", "Q2_0", "register_q2_0"]
