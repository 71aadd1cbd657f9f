"""The wide (16/32-bit word) loads of the decode GEMV kernels decode GGUF blocks to exactly the reference weights.

Bound: bit-identical to `strata.quant.dequantize` (every weight is one float32 product, rounded once, as there), so
the GEMV kernels' float64 bound carries over unchanged whichever loads they use.
"""

import numpy as np
import pytest
import torch

from strata.kernels.moe.decode import SPECS
from strata.kernels.moe.gemv import DecodeExperts, GemvConfig, gate_up_swiglu_triton, moe_gemv_triton
from strata.kernels.moe.wide import WIDE_ALIGN, wide_aligned, wide_dequantize_rows
from strata.quant import dequantize, get_format
from strata.quant.random_blocks import random_blocks


@pytest.mark.parametrize("fmt", sorted(WIDE_ALIGN))
def test_words_decode_to_the_reference_weights_bit_for_bit(device, fmt):
    rows, cols = 13, 512  # 13 rows: the last program's tile is part masked
    n_blocks = rows * cols // get_format(fmt).block_size
    raw = torch.from_numpy(random_blocks(fmt, n_blocks, np.random.default_rng(3))).reshape(rows, -1)
    got = wide_dequantize_rows(raw.to(device), SPECS[fmt], (rows, cols)).cpu()
    want = dequantize(raw, get_format(fmt).ggml_type, (rows, cols))
    assert torch.equal(got, want)


def test_only_aligned_operands_of_the_word_formats_take_wide_loads():
    assert wide_aligned(SPECS["Q4_0"], 1024, 18 * 64, 18 * 8)
    assert not wide_aligned(SPECS["Q4_0"], 1025, 18 * 64, 18 * 8)  # an odd data pointer
    assert wide_aligned(SPECS["Q4_K"], 0, 144 * 3, 144)
    assert not wide_aligned(SPECS["Q4_K"], 2, 144, 144)  # Q4_K reads 32-bit words
    assert not wide_aligned(SPECS["Q2_0"], 0, 0, 18)  # a format without a word path keeps decode32


@pytest.mark.parametrize("fmt", ["Q4_0", "Q8_0", "Q4_K"])
def test_expert_kernels_give_the_same_bytes_with_wide_and_byte_loads(device, fmt):
    from strata.bench.moe_decode import routing, synthetic_stack

    n_ff = 256 if fmt == "Q4_K" else 96  # 96 features: not a multiple of the 64-row tiles below
    stack = synthetic_stack(fmt, fmt, 6, 256, n_ff, seed=4, device=device)
    experts = DecodeExperts.of_stack(stack)
    for m in (experts.gate, experts.up, experts.down):  # so that the comparison below is not vacuous
        assert wide_aligned(m.spec, m.raw.data_ptr(), m.stride, m.row_bytes)
    gen = torch.Generator().manual_seed(5)
    ids, w = (t.to(device) for t in routing(2, 3, 6, gen, shared=1))
    x = torch.randn(2, 256, generator=gen).to(device)
    outs = []
    for wide in (False, True):
        gate_up = GemvConfig(64, 4, 4, 1, wide)
        down = GemvConfig(64, 4 if fmt != "Q4_K" else 1, 4, 4, wide)
        outs.append((gate_up_swiglu_triton(x, ids, experts, gate_up),
                     moe_gemv_triton(x, ids, w, experts, torch.float32, (gate_up, down))))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
