"""The int8 KV format against its definition, bit for bit, and the Triton append kernel against its reference."""

import numpy as np
import pytest
import torch

from strata.kernels.attention.kv_int8 import append_kv_ref, append_kv_triton, dequantize_int8, quantize_int8_ref
from strata.kernels.attention.paged import PagedKV, kv_rows
from tests.kernels import DEVICE


def definition(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The format in numpy, step by step: fp32 max / 127 rounded to fp16, then rint(x / float(s)) clamped."""
    groups = x.astype(np.float32).reshape(*x.shape[:-1], -1, 64)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        s = (np.abs(groups).max(-1) / np.float32(127)).astype(np.float16)
        sf = s.astype(np.float32)[..., None]
        codes = np.where(sf == 0, 0, np.clip(np.rint(groups / sf), -127, 127))
    return codes.astype(np.int8).reshape(x.shape), s


def edge_rows() -> torch.Tensor:
    """Rows of 64 values (as a [n, 64] fp32 tensor) that hit every branch of the rounding."""
    g = torch.Generator().manual_seed(1)
    rows = []
    k = torch.arange(-63, 64, 2).float()  # odd numbers / 2 are exact ties at s = 0.25
    rows.append(torch.cat([torch.tensor([31.75]), k[:63] * 0.125]))  # max 31.75 -> s = 0.25, x/s = k/2
    rows.append(torch.zeros(64))  # s = 0
    rows.append(torch.full((64,), 1e-9) * torch.randn(64, generator=g))  # max / 127 rounds to fp16 zero
    rows.append(torch.randn(64, generator=g) * 1e-5)  # subnormal fp16 scales
    rows.append(torch.randn(64, generator=g) * 3e6)  # large: scale near the top of fp16
    rows.append(torch.randn(64, generator=g) * 1e8)  # max / 127 overflows fp16 to inf
    rows.append(torch.tensor([127.3] + [-127.3] * 63))  # fp16(max/127) < max/127: ratios past 127 clamp
    rows.append(-torch.arange(64).float() * 0.37)  # the maximum is negative
    rows.append(torch.randn(64, generator=g).half().float())  # fp16-representable input
    return torch.stack(rows)


def test_reference_is_the_definition():
    x = torch.cat([edge_rows(), torch.randn(201, 64, generator=torch.Generator().manual_seed(0)) * 3]).reshape(-1, 128)
    codes, scales = quantize_int8_ref(x)
    want_codes, want_scales = definition(x.numpy())
    assert codes.dtype == torch.int8 and scales.dtype == torch.float16
    assert np.array_equal(codes.numpy(), want_codes)
    assert np.array_equal(scales.view(torch.int16).numpy(), want_scales.view(np.int16))
    first = codes[0, :64].tolist()
    assert first[0] == 127 and first[1:4] == [-32, -30, -30]  # -31.5, -30.5, -29.5: ties go to even codes


def test_dequantize_error_is_half_a_step():
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(2)) * 5
    codes, scales = quantize_int8_ref(x)
    step = scales.float().repeat_interleave(64, -1)
    assert ((dequantize_int8(codes, scales) - x).abs() <= step * 0.5 * (1 + 1e-3) + 1e-7).all()
    assert dequantize_int8(codes, scales, torch.float64).dtype == torch.float64


def make_pool(n_pages, n_kv_heads, dim, int8, seed=0):
    pool = PagedKV.empty(n_pages, n_kv_heads, dim, int8=int8, device=DEVICE)
    table = torch.randperm(n_pages, generator=torch.Generator().manual_seed(seed)).int().to(DEVICE)
    return pool, table


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
def test_append_kernel_matches_reference_bit_for_bit():
    n_kv_heads, dim, n_cells = 2, 128, 37
    g = torch.Generator().manual_seed(3)
    edges = edge_rows()
    k = torch.randn(n_cells, n_kv_heads, dim, generator=g) * 2
    v = torch.randn(n_cells, n_kv_heads, dim, generator=g)
    k.view(-1, 64)[: len(edges)] = edges
    v.view(-1, 64)[-len(edges):] = edges.flip(0)
    cells = torch.randperm(n_cells, generator=g) + 5  # out of order, not from cell 0
    for int8 in (True, False):
        a, table = make_pool(16, n_kv_heads, dim, int8)
        b, _ = make_pool(16, n_kv_heads, dim, int8)
        append_kv_ref(a, table, cells.to(DEVICE), k.to(DEVICE), v.to(DEVICE))
        append_kv_triton(b, table, cells.to(DEVICE), k.to(DEVICE).bfloat16() if not int8 else k.to(DEVICE),
                         v.to(DEVICE))
        if not int8:  # bf16 input is converted on the way; compare against the same input
            append_kv_ref(a, table, cells.to(DEVICE), k.to(DEVICE).bfloat16(), v.to(DEVICE))
        for name in ("k", "v", "k_scale", "v_scale"):
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None) == (y is None)
            if x is not None:
                assert torch.equal(x.view(torch.int8 if x.dtype == torch.int8 else torch.int16),
                                   y.view(torch.int8 if y.dtype == torch.int8 else torch.int16)), name


def test_rows_follow_the_page_table():
    pool, table = make_pool(8, 2, 64, True, seed=4)
    cells = torch.arange(32, device=DEVICE)
    k = torch.arange(32 * 2, dtype=torch.float32, device=DEVICE)[:, None].repeat(1, 64).reshape(32, 2, 64) + 1
    append_kv_ref(pool, table, cells, k, k)
    for cell in (0, 5, 31):
        for kvh in range(2):
            row = (int(table[cell // 4]) * 2 + kvh) * 4 + cell % 4
            assert int(kv_rows(table, torch.tensor([cell], device=DEVICE), kvh, 2)) == row
            assert float(pool.k_scale[row, 0]) == float(torch.tensor((cell * 2 + kvh + 1) / 127).half())
