import numpy as np
import pytest
import torch

from strata.errors import StrataError
from strata.kernels.moe.decode import SPECS, decode_spec, dequantize_rows_triton
from strata.quant import dequantize, random_blocks


@pytest.mark.parametrize("name", list(SPECS))
def test_decoder_matches_quant_reference_bit_for_bit(device, name):
    spec = SPECS[name]
    rows, cols = 5, 512
    rng = np.random.default_rng(spec.fmt_id)
    raw = torch.from_numpy(random_blocks(name, rows * cols // spec.block_size, rng, 0.02)).reshape(rows, -1)
    got = dequantize_rows_triton(raw.to(device), name, (rows, cols)).cpu()
    assert torch.equal(got, dequantize(raw, name, (rows, cols)))


def test_unsupported_format_is_named():
    with pytest.raises(StrataError, match="Q5_K"):
        decode_spec("Q5_K")
