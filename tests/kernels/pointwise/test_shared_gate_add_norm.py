"""The gated shared expert's join, the residual add and the next norm in one launch: the bytes of the two kernels
it replaces (shared_gate_triton, add_rms_norm_triton), which test_fused_step_kernels.py holds against torch."""

import pytest
import torch

from strata.kernels.pointwise.add_rms_norm import add_rms_norm_triton
from strata.kernels.pointwise.shared_gate import shared_gate_triton
from strata.kernels.pointwise.shared_gate_add_norm import shared_gate_add_norm_triton
from tests.kernels.pointwise.common import rand


@pytest.mark.parametrize("rows,cols", [(1, 2048), (3, 96)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_bytes_of_the_two_kernels(rows, cols, dtype):
    h, routed, shared, x = (rand((rows, cols), 40 + i, dtype, 2) for i in range(4))
    gate = rand((cols,), 44, dtype, 0.05)
    norm = (1 + 0.1 * rand((cols,), 45, torch.float32)).to(dtype)
    want = add_rms_norm_triton(h, shared_gate_triton(routed, shared, x, gate), norm, 1e-6)
    got = shared_gate_add_norm_triton(h, routed, shared, x, gate, norm, 1e-6)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
