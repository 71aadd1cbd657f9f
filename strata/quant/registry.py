"""The registry of GGML block formats, and dequantize/quantize dispatching through it."""

from dataclasses import dataclass
from typing import Callable

import gguf
import gguf.quants
import numpy as np
import torch

from strata.errors import StrataError
from strata.quant import iquants, kquant_encode, kquants, mxfp4, q2_0, simple

Q2_0_TYPE = 42  # Strata's own type id; upstream ggml does not define Q2_0


@dataclass(frozen=True)
class QuantFormat:
    ggml_type: int
    name: str
    block_size: int  # weights per block
    type_size: int  # bytes per block
    dequantize_blocks: Callable[[torch.Tensor], torch.Tensor]  # uint8 [n, type_size] -> float32 [n, block_size]
    quantize_blocks: Callable[[np.ndarray], np.ndarray] | None = None  # float32 [n, block_size] -> uint8 [n, type_size]

    def row_bytes(self, row_len: int) -> int:
        return row_len // self.block_size * self.type_size


def _by_gguf(name: str) -> Callable[[np.ndarray], np.ndarray]:
    """gguf-py's own quantizer for a format it implements, returning raw bytes."""
    qtype = gguf.GGMLQuantizationType[name]
    return lambda blocks: gguf.quants.quantize(blocks, qtype).view(np.uint8)


def _format(name, block_size, type_size, dequant, quant=None, ggml_type=None) -> QuantFormat:
    ggml_type = int(gguf.GGMLQuantizationType[name]) if ggml_type is None else ggml_type
    return QuantFormat(ggml_type, name, block_size, type_size, dequant, quant)


FORMATS: dict[int, QuantFormat] = {
    f.ggml_type: f
    for f in [
        _format("F32", 1, 4, simple.f32, simple.quantize_f32),
        _format("F16", 1, 2, simple.f16, simple.quantize_f16),
        _format("BF16", 1, 2, simple.bf16, simple.quantize_bf16),
        _format("Q4_0", 32, 18, simple.q4_0, _by_gguf("Q4_0")),
        _format("Q4_1", 32, 20, simple.q4_1, _by_gguf("Q4_1")),
        _format("Q5_0", 32, 22, simple.q5_0, _by_gguf("Q5_0")),
        _format("Q5_1", 32, 24, simple.q5_1, _by_gguf("Q5_1")),
        _format("Q8_0", 32, 34, simple.q8_0, _by_gguf("Q8_0")),
        _format("Q2_K", 256, 84, kquants.q2_k),
        _format("Q3_K", 256, 110, kquants.q3_k),
        _format("Q4_K", 256, 144, kquants.q4_k, kquant_encode.quantize_q4_k),
        _format("Q5_K", 256, 176, kquants.q5_k, kquant_encode.quantize_q5_k),
        _format("Q6_K", 256, 210, kquants.q6_k, kquant_encode.quantize_q6_k),
        _format("IQ1_S", 256, 50, iquants.iq1_s),
        _format("IQ1_M", 256, 56, iquants.iq1_m),
        _format("IQ2_XXS", 256, 66, iquants.iq2_xxs),
        _format("IQ2_XS", 256, 74, iquants.iq2_xs),
        _format("IQ2_S", 256, 82, iquants.iq2_s),
        _format("IQ3_XXS", 256, 98, iquants.iq3_xxs),
        _format("IQ3_S", 256, 110, iquants.iq3_s),
        _format("IQ4_NL", 32, 18, iquants.iq4_nl),
        _format("IQ4_XS", 256, 136, iquants.iq4_xs),
        _format("MXFP4", 32, 17, mxfp4.mxfp4),
        _format("Q2_0", 64, 18, q2_0.q2_0, q2_0.quantize_q2_0, ggml_type=Q2_0_TYPE),
    ]
}
_BY_NAME = {f.name: f for f in FORMATS.values()}


def get_format(qtype: int | str) -> QuantFormat:
    """The format of a ggml type id (an int or gguf.GGMLQuantizationType) or name ("Q4_K", case-insensitive)."""
    found = _BY_NAME.get(qtype.upper()) if isinstance(qtype, str) else FORMATS.get(int(qtype))
    if found is None:
        label = getattr(qtype, "name", qtype)  # a gguf enum member reads better by name
        raise StrataError(f"unsupported quant type {label} (known: {', '.join(_BY_NAME)})")
    return found


def dequantize(raw: torch.Tensor, qtype: int | str, shape: tuple[int, ...]) -> torch.Tensor:
    """Bytes of a tensor's blocks (uint8, any shape, CPU or CUDA) -> float32 of `shape` on raw's device."""
    fmt = get_format(qtype)
    if raw.dtype != torch.uint8:
        raise StrataError(f"{fmt.name} data must be uint8 bytes, got {raw.dtype}")
    if not shape or shape[-1] % fmt.block_size:
        raise StrataError(f"{fmt.name} shape {tuple(shape)}: last dimension must be a multiple of {fmt.block_size}")
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    expected = rows * fmt.row_bytes(shape[-1])
    if raw.numel() != expected:
        raise StrataError(f"{fmt.name} tensor of shape {tuple(shape)} needs {expected} bytes, got {raw.numel()}")
    blocks = raw.reshape(-1, fmt.type_size)
    return fmt.dequantize_blocks(blocks).reshape(shape)


def quantize(array: np.ndarray, qtype: int | str) -> np.ndarray:
    """float weights [..., n] -> uint8 [..., row_bytes] in the format of qtype (n a multiple of its block size)."""
    fmt = get_format(qtype)
    if fmt.quantize_blocks is None:
        raise StrataError(f"no quantizer for {fmt.name}")
    if array.ndim == 0 or array.shape[-1] % fmt.block_size:
        raise StrataError(f"{fmt.name} shape {array.shape}: last dimension must be a multiple of {fmt.block_size}")
    blocks = np.ascontiguousarray(array, dtype=np.float32).reshape(-1, fmt.block_size)
    return fmt.quantize_blocks(blocks).reshape(*array.shape[:-1], fmt.row_bytes(array.shape[-1]))
