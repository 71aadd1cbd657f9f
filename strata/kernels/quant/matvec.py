"""y = x W^T for a few rows of x against a dense weight kept in its GGUF block format, without dequantizing W.

A decode step multiplies one token (a verify window: up to 4) by every dense matrix: attention projections, the
shared expert, the head. Dequantizing a matrix to bf16 first writes and reads it again at 2 bytes a weight, in a dozen
launches; reading the blocks once in a GEMV costs only their own bytes. The kernel is the routed experts' down kernel
(`kernels/moe/gemv.py`, `launch_down`: the word kernel of `wide_gemv.py` for Q4_0/Q8_0/Q4_K, the byte kernel for the
other formats) with one "expert" of weight 1: its precision (weights decoded exactly, float32 sums) and its float64
check carry over (ERROR_BOUND of max |y|). x is read in its own dtype (bf16/fp16 are exact in
float32), and the routing constants (expert 0, weight 1) are made once per device and row count, so a call is one
launch and allocates only its output (under CUDA-graph capture as well).
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


_ONE_EXPERT: dict[tuple[torch.device, int], tuple[torch.Tensor, torch.Tensor]] = {}


def one_expert(device: torch.device, n_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids int32 [n_rows, 1] of zeros, weights float32 [n_rows, 1] of ones) on device: never written."""
    key = (torch.device(device), n_rows)
    kept = _ONE_EXPERT.get(key)
    if kept is not None:
        return kept
    made = (torch.zeros(n_rows, 1, dtype=torch.int32, device=device),
            torch.ones(n_rows, 1, dtype=torch.float32, device=device))
    # Not kept while a CUDA graph records: their fills would only run when that graph replays.
    if not (made[0].is_cuda and torch.cuda.is_current_stream_capturing()):
        _ONE_EXPERT[key] = made
    return made


def quant_matvec(x: torch.Tensor, raw: torch.Tensor, ggml_type: int, shape: tuple[int, int],
                 config=None) -> torch.Tensor:
    """x [..., n_in] times the [n_out, n_in] weight in GGUF blocks `raw` (uint8 [n_out, row_bytes]): [..., n_out]
    in x's dtype. `config` (a GemvConfig) overrides `gemv_config`'s tiles (the benchmark's comparisons)."""
    n_out, n_in = shape
    operand = ExpertOperand(raw.contiguous().reshape(-1), int(ggml_type), n_out, n_in, stride=0)
    rows = x.reshape(-1, 1, n_in).contiguous()
    ids, ones = one_expert(x.device, rows.shape[0])
    config = config or gemv_config("matvec", decode_spec(ggml_type), n_out, n_in, 1, x.is_cuda)
    y = launch_down(rows, ids, ones, operand, None, x.dtype, config)
    return y.reshape(*x.shape[:-1], n_out)
