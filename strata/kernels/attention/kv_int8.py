"""The int8 KV format and the pool's write and read paths.

Per (cell, KV head, 64 values): `s = fp16_RNE(max|x| / 127)`, `code = clamp(rint(x / float(s)), -127, 127)`, 0 where
s == 0; value = code * s. `append_kv` is the Triton write (one program per cell and KV head, K and V together),
`append_kv_ref` its torch reference; they agree bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import strata.kernels  # noqa: F401  (the interpreter switch, before Triton compiles anything)
from strata.kernels.attention.paged import GROUP, PAGE, PagedKV, kv_rows


def quantize_int8_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 codes `[..., D]` and fp16 scales `[..., D // 64]` of `x` (any float dtype, read as fp32)."""
    groups = x.float().unflatten(-1, (-1, GROUP))
    scale = (groups.abs().amax(-1) / 127).half()
    s = scale.float().unsqueeze(-1)
    codes = torch.where(s == 0, 0.0, torch.round(groups / s).clamp(-127, 127))
    return codes.to(torch.int8).flatten(-2), scale


def dequantize_int8(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Values `codes * scale` (exact in fp32 and fp64)."""
    groups = codes.to(dtype).unflatten(-1, (-1, GROUP))
    return (groups * scales.to(dtype).unsqueeze(-1)).flatten(-2)


def gather_kv(pool: PagedKV, page_table: torch.Tensor, cells: torch.Tensor, kvh: int,
              dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of `cells` (any shape) for one KV head, dequantized to `dtype`: shape `cells.shape + (D,)`."""
    rows = kv_rows(page_table, cells, kvh, pool.n_kv_heads)
    if not pool.int8:
        return pool.k[rows].to(dtype), pool.v[rows].to(dtype)
    return (dequantize_int8(pool.k[rows], pool.k_scale[rows], dtype),
            dequantize_int8(pool.v[rows], pool.v_scale[rows], dtype))


def append_kv_ref(pool: PagedKV, page_table: torch.Tensor, cells: torch.Tensor,
                  k: torch.Tensor, v: torch.Tensor) -> None:
    """Write keys and values `[n, n_kv_heads, D]` of logical `cells` `[n]` into the pool."""
    rows = kv_rows(page_table, cells[:, None], torch.arange(pool.n_kv_heads, device=cells.device), pool.n_kv_heads)
    for x, codes, scales in ((k, pool.k, pool.k_scale), (v, pool.v, pool.v_scale)):
        if scales is None:
            codes[rows] = x.to(codes.dtype)
        else:
            codes[rows], scales[rows] = quantize_int8_ref(x)


@triton.jit
def _quantize_store(x, code_ptr, scale_ptr, row, G: tl.constexpr, NG: tl.constexpr, INT8: tl.constexpr):
    """Quantize one row `x` [NG, G] (fp32) and store its codes and scales (or its fp16 values)."""
    g = tl.arange(0, NG)[:, None]
    d = tl.arange(0, G)[None, :]
    if INT8:
        amax = tl.max(tl.abs(x), axis=1)
        scale = tl.math.div_rn(amax, tl.zeros_like(amax) + 127.0).to(tl.float16)  # IEEE division, like torch's
        s = scale.to(tl.float32)[:, None]
        y = tl.math.div_rn(x, tl.zeros_like(x) + tl.where(s == 0, 1.0, s))
        y = (y + 12582912.0) - 12582912.0  # rint, ties to even: exact for |y| < 2^22
        y = tl.minimum(tl.maximum(y, -127.0), 127.0)
        tl.store(code_ptr + row * (NG * G) + g * G + d, tl.where(s == 0, 0.0, y).to(tl.int8))
        tl.store(scale_ptr + row * NG + tl.arange(0, NG), scale)
    else:
        tl.store(code_ptr + row * (NG * G) + g * G + d, x.to(tl.float16))


@triton.jit
def _append_kernel(k_ptr, v_ptr, cells_ptr, page_table_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, n_kv_heads,
                   G: tl.constexpr, NG: tl.constexpr, INT8: tl.constexpr):
    i = tl.program_id(0)
    kvh = tl.program_id(1)
    cell = tl.load(cells_ptr + i)
    page = tl.load(page_table_ptr + cell // 4).to(tl.int64)
    row = (page * n_kv_heads + kvh) * 4 + cell % 4
    src = (i.to(tl.int64) * n_kv_heads + kvh) * (NG * G) + tl.arange(0, NG)[:, None] * G + tl.arange(0, G)[None, :]
    _quantize_store(tl.load(k_ptr + src).to(tl.float32), kc_ptr, ks_ptr, row, G, NG, INT8)
    _quantize_store(tl.load(v_ptr + src).to(tl.float32), vc_ptr, vs_ptr, row, G, NG, INT8)


def append_kv(pool: PagedKV, page_table: torch.Tensor, cells: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Write K and V into the pool: the Triton kernel on the GPU, the reference on the CPU."""
    (append_kv_triton if k.is_cuda else append_kv_ref)(pool, page_table, cells, k, v)


def append_kv_triton(pool: PagedKV, page_table: torch.Tensor, cells: torch.Tensor,
                     k: torch.Tensor, v: torch.Tensor) -> None:
    """`append_kv_ref` as one Triton launch (on CPU tensors through the interpreter)."""
    n, n_kv_heads, dim = k.shape
    assert n_kv_heads == pool.n_kv_heads and dim == pool.head_dim and PAGE == 4
    if n == 0:
        return
    scales = (pool.k_scale, pool.v_scale) if pool.int8 else (pool.k, pool.v)  # unused pointers for fp16
    _append_kernel[(n, n_kv_heads)](k.contiguous(), v.contiguous(), cells.to(torch.int32).contiguous(),
                                    page_table.to(torch.int32).contiguous(), pool.k, pool.v, *scales, n_kv_heads,
                                    G=GROUP, NG=dim // GROUP, INT8=pool.int8, num_warps=2)
