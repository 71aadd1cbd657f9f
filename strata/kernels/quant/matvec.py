"""y = x W^T for a few rows of x against a dense weight kept in its GGUF block format, without dequantizing W.

A decode step multiplies one token (a verify window: up to 4) by every dense matrix: attention projections, the
shared expert, the head. Dequantizing a matrix to bf16 first writes and reads it again at 2 bytes a weight, in a dozen
launches; reading the blocks once in a GEMV costs only their own bytes. The kernel is the routed experts' down kernel
(`kernels/moe/gemv.py`, `_down_kernel`) with one "expert" of weight 1: its precision (weights decoded exactly, float32
sums) and its float64 check carry over (ERROR_BOUND of max |y|).
"""

from __future__ import annotations

import torch

from strata.kernels.moe.decode import SPECS, decode_spec
from strata.kernels.moe.gemv import ERROR_BOUND, ExpertOperand, gemv_config, launch_down
from strata.kernels.moe.stack import dot_length_fits
from strata.quant import get_format

MAX_ROWS = 4  # up to a verify window; past that, dequantize once and use the tensor cores (reads W once in all)

__all__ = ["ERROR_BOUND", "MAX_ROWS", "matvec_applies", "quant_matvec"]


def matvec_applies(x: torch.Tensor, ggml_type: int) -> bool:
    """Whether `linear` takes the kernel: on the GPU, below float32 (the reference path stays exact), few rows,
    a format the decode kernels read."""
    rows = x.numel() // max(x.shape[-1], 1)
    name = get_format(ggml_type).name
    return (x.is_cuda and x.dtype != torch.float32 and rows <= MAX_ROWS and name in SPECS
            and dot_length_fits(SPECS[name], x.shape[-1]))


def quant_matvec(x: torch.Tensor, raw: torch.Tensor, ggml_type: int, shape: tuple[int, int]) -> torch.Tensor:
    """x [..., n_in] times the [n_out, n_in] weight in GGUF blocks `raw` (uint8 [n_out, row_bytes]): [..., n_out]
    in x's dtype."""
    n_out, n_in = shape
    operand = ExpertOperand(raw.contiguous().reshape(-1), int(ggml_type), n_out, n_in, stride=0)
    rows = x.reshape(-1, 1, n_in).float().contiguous()
    ids = torch.zeros(rows.shape[0], 1, dtype=torch.int32, device=x.device)
    ones = torch.ones(rows.shape[0], 1, dtype=torch.float32, device=x.device)
    # The gate/up kernel's tiles (8 rows x ~512 weights a step): with one "expert" the down kernel's own would
    # leave most of a program idle.
    config = gemv_config("gate_up", decode_spec(ggml_type), n_out, n_in, 1, x.is_cuda)
    y = launch_down(rows, ids, ones, operand, None, x.dtype, config)
    return y.reshape(*x.shape[:-1], n_out)
