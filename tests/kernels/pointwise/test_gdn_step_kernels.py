"""The GatedDeltaNet decode step's kernels (the causal conv + gates, the output gate) against the torch lines of
models/gated_deltanet.py that the CPU, float32 and prompt chunks keep, and against float64 with the bounds stated."""

import pytest
import torch
import torch.nn.functional as F

from strata.kernels.pointwise.gdn_conv_step import conv_step_triton
from strata.kernels.pointwise.gdn_out_gate import out_gate_triton
from strata.models.gated_deltanet import causal_conv, conv_and_gates, output_gate
from strata.models.layers import rms_norm
from tests.kernels.pointwise.common import DEVICE, STEPS, rand, ulp


def _conv_inputs(n_tokens, dtype, channels=200, kernel=4, heads=6):
    x = rand((n_tokens, channels), 1, dtype, 2)
    weight = rand((channels, kernel), 2, dtype, 0.5)
    past = rand((kernel - 1, channels), 3, dtype, 2)
    b = rand((n_tokens, heads), 4, dtype, 3)
    # a + dt_bias spans softplus's three regimes: far below zero, the curve, and linear past 20.
    a = torch.linspace(-40, 40, n_tokens * heads).view(n_tokens, heads).to(dtype).to(DEVICE)
    dt_bias = rand((heads,), 5, dtype, 0.1)
    decay_rate = -torch.rand(heads, generator=torch.Generator().manual_seed(6)).to(DEVICE) * 4
    return x, weight, past, b, a, dt_bias, decay_rate


@pytest.mark.parametrize("n_tokens", [1, 3])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_conv_step_matches_torch_and_float64(n_tokens, dtype):
    x, weight, past, b, a, dt_bias, decay_rate = _conv_inputs(n_tokens, dtype)
    old_past = past.clone()
    want, want_past = causal_conv(x, weight, old_past)
    # 64 channels a program: four programs, the last one partly masked.
    got, got_past, beta, g = conv_step_triton(x, weight, past, b, a, dt_bias, decay_rate, block_channels=64)
    assert got_past is past and torch.equal(past, want_past)  # the new past is copied values: exact, in place
    # Both sum the taps in float32 and round once, then SiLU rounds once; the order of the sum may move the
    # conv by one step: within STEPS + 1 steps of the row's largest value.
    bound = (STEPS + 1) * ulp(dtype) * want.float().abs().amax(-1, True)
    assert ((got.float() - want.float()).abs() <= bound).all()
    window = torch.cat((old_past, x)).double()
    conv = sum(window[j:j + n_tokens] * weight.double()[:, j] for j in range(weight.shape[1]))
    exact = F.silu(conv)
    assert ((got.double() - exact).abs().max() / exact.abs().max()).item() < (STEPS + 2) * ulp(dtype)
    want_beta = torch.sigmoid(b.float())
    want_g = decay_rate * F.softplus(a.float() + dt_bias.float())
    assert torch.allclose(beta, want_beta, rtol=1e-5, atol=1e-7)
    assert torch.allclose(g, want_g, rtol=1e-5, atol=1e-7)
    exact_g = decay_rate.double() * F.softplus(a.double() + dt_bias.double())
    assert ((g.double() - exact_g).abs() <= 1e-5 * exact_g.abs() + 1e-12).all()


def test_conv_step_reads_strided_rows():
    """b and a as column slices of one matvec's output (the stacked projections): rows spaced wider than they are."""
    x, weight, past, b, a, dt_bias, decay_rate = _conv_inputs(2, torch.bfloat16)
    both = torch.cat((b, a), dim=-1)
    _, _, beta, g = conv_step_triton(x, weight, past.clone(), both[:, :6], both[:, 6:], dt_bias, decay_rate)
    _, _, want_beta, want_g = conv_step_triton(x, weight, past.clone(), b, a, dt_bias, decay_rate)
    assert torch.equal(beta, want_beta) and torch.equal(g, want_g)


def test_conv_and_gates_on_the_cpu_is_torch_and_leaves_the_past():
    x, weight, past, b, a, dt_bias, decay_rate = (t.cpu() for t in _conv_inputs(2, torch.bfloat16))
    old = past.clone()
    mixed, new_past, beta, g = conv_and_gates(x, weight, past, b, a, dt_bias, decay_rate)
    want, want_past = causal_conv(x, weight, old)
    assert torch.equal(past, old) and torch.equal(mixed, want) and torch.equal(new_past, want_past)
    assert torch.equal(beta, torch.sigmoid(b.float()))
    assert torch.equal(g, decay_rate * F.softplus(a.float() + dt_bias.float()))


@pytest.mark.parametrize("sigmoid", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_out_gate_matches_torch_and_float64(sigmoid, dtype):
    out, z = rand((2, 5, 48), 7, dtype, 2), rand((2, 5, 48), 8, dtype, 2)
    weight = (1 + 0.1 * rand((48,), 9, torch.float32)).to(dtype)
    got = out_gate_triton(out, weight, z, 1e-6, sigmoid, heads_per_program=4)  # 10 rows: the last program masked
    act = torch.sigmoid if sigmoid else F.silu
    want = (rms_norm(out, weight, 1e-6).float() * act(z.float())).to(dtype)
    # The norm rounds twice as torch's does (its sum in another order), the product once: within STEPS + 2 steps
    # of the head's largest value.
    bound = (STEPS + 2) * ulp(dtype) * want.float().abs().amax(-1, True)
    assert ((got.float() - want.float()).abs() <= bound).all()
    od = out.double()
    exact = weight.double() * od / od.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * act(z.double())
    assert ((got.double() - exact).abs().max() / exact.abs().max()).item() < (STEPS + 3) * ulp(dtype)


def test_output_gate_on_the_cpu_is_torch_byte_for_byte():
    out, z = torch.randn(2, 4, 32).bfloat16(), torch.randn(2, 4, 32).bfloat16()
    weight = torch.rand(32).bfloat16()
    for sigmoid, act in ((False, F.silu), (True, torch.sigmoid)):
        want = (rms_norm(out, weight, 1e-6).float() * act(z.float())).to(torch.bfloat16)
        assert torch.equal(output_gate(out, weight, z, 1e-6, torch.bfloat16, sigmoid), want)
