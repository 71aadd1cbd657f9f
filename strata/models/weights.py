"""Weights kept in their GGUF format on the device, dequantized where they are used."""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np
import torch

from strata.gguf.reader import TensorInfo

# GGML type ids whose bytes are already plain floats: viewed, never converted ahead of use.
FLOAT_VIEWS = {0: torch.float32, 1: torch.float16, 30: torch.bfloat16}
# A small float matrix on the GPU (an F32 router) keeps its conversion to the activation dtype: converting it on
# every call was a copy kernel per layer and token. Larger ones (a whole F16 model) are converted where used.
KEEP_CONVERTED_BYTES = 16 << 20


def bytes_as_tensor(data: np.ndarray) -> torch.Tensor:
    with warnings.catch_warnings():
        # The mapping is copy-on-write; torch warns about any numpy array it cannot prove writable.
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(data)


class QuantWeight:
    """A tensor in GGML block format: raw bytes `[..., bytes_per_row]` plus its logical shape."""

    def __init__(self, name: str, ggml_type: int, shape: tuple[int, ...], raw: torch.Tensor):
        self.name, self.ggml_type, self.shape, self.raw = name, ggml_type, tuple(shape), raw
        self._converted: dict[torch.dtype, torch.Tensor] = {}

    @classmethod
    def from_info(cls, info: TensorInfo, device: torch.device | str = "cpu") -> "QuantWeight":
        return cls(info.name, info.ggml_type, info.shape, bytes_as_tensor(info.data).to(device))

    @property
    def device(self) -> torch.device:
        return self.raw.device

    @property
    def n_bytes(self) -> int:
        return self.raw.numel()

    def __getitem__(self, index) -> "QuantWeight":
        """Rows along the first dimension (an expert of a stacked tensor, token rows of an embedding)."""
        raw = self.raw[index]
        return QuantWeight(self.name, self.ggml_type, (*raw.shape[:-1], self.shape[-1]), raw)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        float_type = FLOAT_VIEWS.get(self.ggml_type)
        if float_type is not None:
            kept = self._converted.get(dtype)
            if kept is not None:
                return kept
            out = self.raw.contiguous().view(float_type).reshape(self.shape).to(dtype)
            small = out.numel() * out.element_size() <= KEEP_CONVERTED_BYTES
            # Not while a CUDA graph records: its conversion would only run when that graph replays.
            if self.raw.is_cuda and float_type != dtype and small and not torch.cuda.is_current_stream_capturing():
                self._converted[dtype] = out
            return out
        from strata.quant import dequantize

        return dequantize(self.raw, self.ggml_type, self.shape).to(dtype)

    def kept_as(self, dtype: torch.dtype) -> bool:
        """Whether `dequantize(dtype)` returns a tensor that exists already (a float view of the raw bytes, or a
        conversion kept by an earlier call), so that no kernel queued now writes it."""
        float_type = FLOAT_VIEWS.get(self.ggml_type)
        return float_type is not None and (float_type == dtype or dtype in self._converted)

    def to(self, device: torch.device | str) -> "QuantWeight":
        return QuantWeight(self.name, self.ggml_type, self.shape, self.raw.to(device))


def stacked_rows(name: str, *weights: QuantWeight) -> tuple[QuantWeight, ...] | None:
    """(one weight holding the rows of `weights` in order, then each of `weights` again as a view of its rows), or
    None unless they share a block format, input width and device. Block rows are independent, so stacking their
    bytes is exact, and the views mean no second copy: one matvec over the stack reads q, k and v in one launch."""
    first = weights[0]
    if first.ggml_type in FLOAT_VIEWS or any(
            w.ggml_type != first.ggml_type or len(w.shape) != 2 or w.shape[1] != first.shape[1]
            or w.raw.shape[-1] != first.raw.shape[-1] or w.device != first.device for w in weights):
        return None
    stack = QuantWeight(name, first.ggml_type, (sum(w.shape[0] for w in weights), first.shape[1]),
                        torch.cat([w.raw for w in weights]))
    views, start = [], 0
    for w in weights:
        views.append(QuantWeight(w.name, w.ggml_type, w.shape, stack.raw[start:start + w.shape[0]]))
        start += w.shape[0]
    return (stack, *views)


# Inside a verify window (`rows_as_steps`), steps of up to this many rows run torch's matmul one row at a time: a
# GEMM of M rows may sum in another order than M = 1, and a window's row must be plain decode's step bit for bit.
ROW_BY_ROW_MAX_ROWS = 4
_ROWS_AS_STEPS: ContextVar[bool] = ContextVar("rows_as_steps", default=False)


@contextmanager
def rows_as_steps(on: bool = True):
    """Within: the step being computed is a verify window, each of whose rows must compute as the one-token step at
    its position (torch's matmuls row by row). Prompt chunks stay outside, as fast and as they were."""
    token = _ROWS_AS_STEPS.set(on)
    try:
        yield
    finally:
        _ROWS_AS_STEPS.reset(token)


def in_window() -> bool:
    """Whether the step being computed is a verify window (`rows_as_steps`): decode steps, never a prompt chunk."""
    return _ROWS_AS_STEPS.get()


def row_by_row(x: torch.Tensor) -> bool:
    """Whether torch's matmuls over x [rows, ...] go one row at a time: in a verify window of 2..4 rows."""
    return _ROWS_AS_STEPS.get() and x.dim() == 2 and 1 < x.shape[0] <= ROW_BY_ROW_MAX_ROWS


def linear(x: torch.Tensor, weight: QuantWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    if x.is_cuda and weight.ggml_type not in FLOAT_VIEWS:
        from strata.kernels.quant.matvec import matvec_applies, quant_matvec

        if matvec_applies(x, weight.ggml_type):  # a decode step: read the blocks once instead of dequantizing
            y = quant_matvec(x, weight.raw, weight.ggml_type, weight.shape)  # each row its own programs: row-exact
            return y if bias is None else y + bias
    dense = weight.dequantize(x.dtype)
    if row_by_row(x):
        return torch.cat([torch.nn.functional.linear(x[r:r + 1], dense, bias) for r in range(x.shape[0])])
    return torch.nn.functional.linear(x, dense, bias)
