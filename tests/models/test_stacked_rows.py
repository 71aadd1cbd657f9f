"""The q/k/v row stack a GPU decode step reads in one matvec: exact, no second copy, refused where it cannot be."""

import numpy as np
import torch

from strata.models.weights import QuantWeight, stacked_rows
from strata.quant import get_format
from strata.quant.random_blocks import random_blocks


def weight(name: str, qtype: str, rows: int, cols: int, seed: int) -> QuantWeight:
    fmt = get_format(qtype)
    blocks = random_blocks(qtype, rows * cols // fmt.block_size, np.random.default_rng(seed))
    raw = torch.from_numpy(blocks.reshape(rows, -1).copy())
    return QuantWeight(name, fmt.ggml_type, (rows, cols), raw)


def test_the_stack_holds_each_weight_row_for_row_and_the_parts_are_views_of_it():
    q, k, v = weight("q", "Q4_0", 64, 128, 1), weight("k", "Q4_0", 32, 128, 2), weight("v", "Q4_0", 32, 128, 3)
    stack, q2, k2, v2 = stacked_rows("qkv", q, k, v)
    assert stack.shape == (128, 128) and stack.ggml_type == q.ggml_type
    whole = stack.dequantize()
    assert torch.equal(whole, torch.cat([q.dequantize(), k.dequantize(), v.dequantize()]))
    for part, original in ((q2, q), (k2, k), (v2, v)):
        assert part.shape == original.shape and torch.equal(part.dequantize(), original.dequantize())
        assert part.raw.untyped_storage().data_ptr() == stack.raw.untyped_storage().data_ptr()  # no second copy


def test_weights_of_other_formats_or_widths_are_not_stacked():
    q = weight("q", "Q4_0", 64, 128, 1)
    assert stacked_rows("qkv", q, weight("k", "Q8_0", 32, 128, 2), weight("v", "Q4_0", 32, 128, 3)) is None
    assert stacked_rows("qkv", q, weight("k", "Q4_0", 32, 256, 2), weight("v", "Q4_0", 32, 128, 3)) is None
