"""One projection of a layer's routed experts as the kernels read it: GGUF blocks [E, rows, row_bytes] in one tensor."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from strata.errors import StrataError
from strata.kernels.moe.decode import DecodeSpec, decode_spec
from strata.quant import dequantize, get_format


@dataclass(frozen=True)
class ExpertMatrix:
    raw: torch.Tensor  # uint8 [E, rows, row_bytes], contiguous
    qtype: int
    rows: int  # outputs per expert
    cols: int  # inputs per expert (the dot length)

    @classmethod
    def of(cls, weight) -> "ExpertMatrix":
        """From anything with .raw (uint8 bytes), .ggml_type and .shape (E, rows, cols): a QuantWeight of a stack."""
        n_experts, rows, cols = weight.shape
        row_bytes = get_format(weight.ggml_type).row_bytes(cols)
        raw = weight.raw
        if raw.dtype != torch.uint8 or raw.numel() != n_experts * rows * row_bytes:
            raise StrataError(f"expert tensor of shape {tuple(weight.shape)} needs {n_experts * rows * row_bytes} "
                              f"uint8 bytes, got {raw.numel()} of {raw.dtype}")
        return cls(raw.reshape(n_experts, rows, row_bytes).contiguous(), int(weight.ggml_type), rows, cols)

    @property
    def spec(self) -> DecodeSpec:
        return decode_spec(self.qtype)

    @property
    def n_experts(self) -> int:
        return self.raw.shape[0]

    @property
    def row_bytes(self) -> int:
        return self.raw.shape[2]

    @property
    def expert_bytes(self) -> int:
        return self.rows * self.row_bytes

    @property
    def expert_stride(self) -> int:
        """Bytes from one expert's first row to the next: expert_bytes when stacked, a slot's size over cache slots."""
        return self.raw.stride(0)

    def expert(self, e: int) -> torch.Tensor:
        """Expert e's weights, float32 [rows, cols] (the references)."""
        return dequantize(self.raw[e], self.qtype, (self.rows, self.cols))

    def check_dot_length(self, k: int) -> None:
        spec = self.spec
        if self.cols != k or not dot_length_fits(spec, k):
            raise StrataError(f"{spec.name} experts of {self.cols} inputs cannot take rows of {k} values (the kernels "
                              f"step 64 values at a time, whole {spec.block_size}-weight blocks)")


def dot_length_fits(spec: DecodeSpec, k: int) -> bool:
    """Whether the kernels can take dot products of length k: they step 64 values at a time over whole blocks."""
    return k % 64 == 0 and k % spec.block_size == 0


def tile_config(kind: str, spec: DecodeSpec, n_out: int, on_gpu: bool) -> tuple[int, int]:
    """(output columns per program, warps) of the expert kernels ("mm", "gate_up", "dense").

    On a GPU: 8 warps and 64 columns, but 32 for the fused gate/up kernel of the formats with a heavier decode, whose
    two accumulators would otherwise spill (sm_90 builds, checked by tests/kernels/moe/test_sm90_build.py). Under
    the interpreter: wide programs, since its cost is per operation.
    """
    if not on_gpu:
        return min(256, max(32, 1 << (n_out - 1).bit_length())), 4
    return (32 if kind == "gate_up" and not spec.scale_per_64 else 64), 8
