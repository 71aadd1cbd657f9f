"""A step's token embeddings in one launch: the rows of the token embedding its ids name, dequantized to the
activation dtype, as `QuantWeight.__getitem__(ids).dequantize(dtype)` computes them in torch (a gather, then the
format's ops: for Q4_0 about six launches, ~12 us of an A3B decode step's critical path on an H200).

The same bytes: a weight of a Q4_0 / Q8_0 block is the exact float32 product of the block's fp16 scale and its code
(Q4_0: the nibble minus 8; Q8_0: the int8), rounded once to the dtype; F32 / F16 / BF16 rows are converted. Other
formats return None (the caller runs torch's ops).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

FORMATS = (0, 1, 30, 2, 8)  # the ggml type ids it reads: F32, F16, BF16, Q4_0, Q8_0 (32-weight blocks: 18, 34 bytes)
COLS_A_PROGRAM = 2048


@triton.jit
def _embed_rows_kernel(raw_ptr, ids_ptr, out_ptr, row_bytes, n_cols, FMT: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = c < n_cols
    row = raw_ptr + tl.load(ids_ptr + t).to(tl.int64) * row_bytes
    if FMT == 0:
        v = tl.load(row.to(tl.pointer_type(tl.float32)) + c, mask=mask, other=0.0)
    elif FMT == 1:
        v = tl.load(row.to(tl.pointer_type(tl.float16)) + c, mask=mask, other=0.0).to(tl.float32)
    elif FMT == 30:
        v = tl.load(row.to(tl.pointer_type(tl.bfloat16)) + c, mask=mask, other=0.0).to(tl.float32)
    elif FMT == 2:  # weight j of a block: the low nibble of code byte j for j < 16, else the high one of byte j - 16
        block = row + (c // 32) * 18
        d = tl.load(block.to(tl.pointer_type(tl.float16)), mask=mask, other=0.0).to(tl.float32)
        byte = tl.load(block + 2 + c % 16, mask=mask, other=0)
        v = d * (tl.where(c % 32 < 16, byte & 15, byte >> 4).to(tl.float32) - 8.0)
    else:  # Q8_0
        block = row + (c // 32) * 34
        d = tl.load(block.to(tl.pointer_type(tl.float16)), mask=mask, other=0.0).to(tl.float32)
        v = tl.load((block + 2 + c % 32).to(tl.pointer_type(tl.int8)), mask=mask, other=0).to(tl.float32) * d
    tl.store(out_ptr + t.to(tl.int64) * n_cols + c, v.to(out_ptr.dtype.element_ty), mask=mask)


def embed_rows_triton(raw: torch.Tensor, ggml_type: int, n_cols: int, ids: torch.Tensor,
                      dtype: torch.dtype) -> torch.Tensor | None:
    """raw [V, row_bytes] uint8 (an embedding's GGUF rows, rows at any stride), ids (any shape) -> [*ids.shape,
    n_cols] of dtype, or None where the format is not one this kernel reads."""
    fmt = int(ggml_type)
    if fmt not in FORMATS or raw.dim() != 2 or raw.stride(1) != 1 or (fmt in (2, 8) and n_cols % 32):
        return None
    flat = ids.reshape(-1)
    out = torch.empty(flat.numel(), n_cols, dtype=dtype, device=raw.device)
    if flat.numel():
        block = min(COLS_A_PROGRAM, triton.next_power_of_2(n_cols))
        _embed_rows_kernel[(flat.numel(), triton.cdiv(n_cols, block))](raw, flat, out, raw.stride(0), n_cols, FMT=fmt,
                                                                      BLOCK=block, num_warps=4)
    return out.reshape(*ids.shape, n_cols)
