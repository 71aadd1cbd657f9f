"""Plain floats and the 32-weight legacy blocks (Q4_0 .. Q8_0): one fp16 scale (and offset) per block."""

import numpy as np
import torch

from strata.quant.fields import fp16_at, interleaved, planes, view_as


def f32(blocks: torch.Tensor) -> torch.Tensor:
    return view_as(blocks, torch.float32)


def f16(blocks: torch.Tensor) -> torch.Tensor:
    return fp16_at(blocks, 0)


def bf16(blocks: torch.Tensor) -> torch.Tensor:
    # bf16 is the top half of a float32; shifting keeps every bit (NaN payloads included).
    return (view_as(blocks, torch.int16).int() << 16).view(torch.float32)


def quantize_f32(blocks: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(blocks, dtype=np.float32).view(np.uint8)


def quantize_f16(blocks: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(blocks, dtype=np.float32).astype(np.float16).view(np.uint8)


def quantize_bf16(blocks: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bytes as ggml rounds (to nearest even, NaN kept quiet), in one pass over the array:
    gguf-py's row-by-row encoder writes under 1 MB/s, too slow for a full-size synthetic model."""
    bits = np.ascontiguousarray(blocks, dtype=np.float32).view(np.uint32)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = ((bits.astype(np.uint64) + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    rounded[nan] = ((bits[nan] >> 16) | 64).astype(np.uint16)
    return rounded.view(np.uint8)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """16 bytes -> 32 codes: low nibbles are weights 0..15, high nibbles 16..31."""
    return planes(qs, 4).flatten(-2)


def _fifth_bits(qh: torch.Tensor) -> torch.Tensor:
    """4 bytes (one little-endian uint32) -> bit j for weight j, as [n, 32]."""
    return interleaved(qh, 1)


def q4_0(blocks: torch.Tensor) -> torch.Tensor:
    q = _nibbles(blocks[:, 2:]).float() - 8
    return fp16_at(blocks, 0) * q


def q4_1(blocks: torch.Tensor) -> torch.Tensor:
    q = _nibbles(blocks[:, 4:]).float()
    return fp16_at(blocks, 0) * q + fp16_at(blocks, 2)


def q5_0(blocks: torch.Tensor) -> torch.Tensor:
    q = (_nibbles(blocks[:, 6:]) | (_fifth_bits(blocks[:, 2:6]) << 4)).float() - 16
    return fp16_at(blocks, 0) * q


def q5_1(blocks: torch.Tensor) -> torch.Tensor:
    q = (_nibbles(blocks[:, 8:]) | (_fifth_bits(blocks[:, 4:8]) << 4)).float()
    return fp16_at(blocks, 0) * q + fp16_at(blocks, 2)


def q8_0(blocks: torch.Tensor) -> torch.Tensor:
    return blocks[:, 2:].view(torch.int8).float() * fp16_at(blocks, 0)
