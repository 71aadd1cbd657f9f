"""The two forms of the gated delta rule against each other and against a float64 loop over the definition."""

import pytest
import torch
import torch.nn.functional as F

from strata.kernels.gdn import (
    fla_kernels,
    gated_delta_rule,
    gated_delta_rule_chunked,
    gated_delta_rule_f64,
    gated_delta_rule_fla,
    gated_delta_rule_recurrent,
)


def _inputs(n_tokens, n_k_heads=2, n_v_heads=4, dk=16, dv=8, seed=0, dtype=torch.float32, with_state=True):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    q, k = randn(n_tokens, n_k_heads, dk), randn(n_tokens, n_k_heads, dk)
    v = randn(n_tokens, n_v_heads, dv)
    # The model's decay: -exp(A) * softplus(a + dt_bias), from a little to a lot of forgetting per token.
    g = -randn(n_v_heads).exp() * F.softplus(randn(n_tokens, n_v_heads))
    beta = randn(n_tokens, n_v_heads).sigmoid()
    state = randn(n_v_heads, dk, dv) if with_state else None
    return [x.to(dtype) for x in (q, k, v, g, beta)] + [state]


def _rel(ours, ref):
    return ((ours.double() - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("n_tokens", [1, 5, 64, 150])
def test_both_forms_match_float64(n_tokens):
    inputs = _inputs(n_tokens)
    ref_out, ref_state = gated_delta_rule_f64(*inputs)
    for form in (gated_delta_rule_chunked, gated_delta_rule_recurrent):
        out, state = form(*inputs)
        assert out.dtype == torch.float32 and state.shape == ref_state.shape
        assert _rel(out, ref_out) < 1e-5, form.__name__
        assert _rel(state, ref_state) < 1e-5, form.__name__


def test_chunked_in_float64_is_exact():
    q, k, v, g, beta, state = _inputs(130, n_k_heads=1, n_v_heads=3, dk=8, dv=12, seed=1)
    ref_out, ref_state = gated_delta_rule_f64(q, k, v, g, beta, state)
    out, final = gated_delta_rule_chunked(q.double(), k.double(), v.double(), g, beta, state.double())
    assert out.dtype == final.dtype == torch.float64
    assert _rel(out, ref_out) < 1e-12 and _rel(final, ref_state) < 1e-12


def test_chunk_size_and_split_points_do_not_matter():
    """A prompt in chunks of any size, then decode token by token carrying the state, is one long sequence."""
    q, k, v, g, beta, state = _inputs(100, seed=2)
    whole, whole_state = gated_delta_rule_chunked(q, k, v, g, beta, state.double())
    for chunk in (16, 64):
        out, _ = gated_delta_rule_chunked(q, k, v, g, beta, state.double(), chunk=chunk)
        assert _rel(out, whole) < 1e-12
    out_a, carried = gated_delta_rule_chunked(q[:70], k[:70], v[:70], g[:70], beta[:70], state.double())
    parts = [out_a]
    for t in range(70, 100):
        o, carried = gated_delta_rule_recurrent(q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1], beta[t:t + 1], carried)
        parts.append(o)
    assert _rel(torch.cat(parts), whole) < 1e-12
    assert _rel(carried, whole_state) < 1e-12


def test_no_state_means_zeros_and_bfloat16_inputs_compute_in_float32():
    q, k, v, g, beta, _ = _inputs(40, seed=3, with_state=False)
    out, state = gated_delta_rule_chunked(q.bfloat16(), k.bfloat16(), v.bfloat16(), g, beta)
    assert out.dtype == torch.bfloat16 and state.dtype == torch.float32
    ref_out, ref_state = gated_delta_rule_f64(q.bfloat16(), k.bfloat16(), v.bfloat16(), g, beta)
    assert _rel(out, ref_out) < 1e-2 and _rel(state, ref_state) < 1e-5


def test_strong_decay_and_no_normalisation_stay_finite():
    q, k, v, g, beta, state = _inputs(90, seed=4)
    g = g * 50  # per-token decays down to e^-hundreds: the masked exponentials must not overflow
    for normalize in (True, False):
        ref_out, ref_state = gated_delta_rule_f64(q, k, v, g, beta, state, normalize_qk=normalize, scale=0.5)
        out, final = gated_delta_rule_chunked(q, k, v, g, beta, state, normalize_qk=normalize, scale=0.5)
        assert torch.isfinite(out).all() and torch.isfinite(final).all()
        assert _rel(out, ref_out) < 1e-4 and _rel(final, ref_state) < 1e-4


def test_dispatch_on_cpu_uses_the_references():
    inputs = _inputs(3, seed=5)
    out, state = gated_delta_rule(*inputs)
    ref_out, ref_state = gated_delta_rule_recurrent(*inputs)
    assert torch.equal(out, ref_out) and torch.equal(state, ref_state)
    inputs = _inputs(40, seed=5)
    assert torch.equal(gated_delta_rule(*inputs)[0], gated_delta_rule_chunked(*inputs)[0])


def test_value_heads_must_be_a_multiple_of_key_heads():
    with pytest.raises(ValueError, match="multiple"):
        gated_delta_rule_recurrent(*_inputs(2, n_k_heads=3, n_v_heads=4))


@pytest.mark.skipif(not torch.cuda.is_available() or fla_kernels() is None, reason="needs CUDA and fla-core")
@pytest.mark.parametrize("n_tokens", [1, 200])
def test_fla_matches_float64(n_tokens):
    q, k, v, g, beta, state = _inputs(n_tokens, n_k_heads=2, n_v_heads=4, dk=64, dv=64, seed=6)
    ref_out, ref_state = gated_delta_rule_f64(q.bfloat16(), k.bfloat16(), v.bfloat16(), g, beta, state)
    cuda = [x.cuda() for x in (q.bfloat16(), k.bfloat16(), v.bfloat16(), g, beta, state)]
    out, final = gated_delta_rule_fla(*cuda)
    assert _rel(out.cpu(), ref_out) < 2e-2 and _rel(final.cpu(), ref_state) < 2e-2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_float32_on_cuda_keeps_the_exact_reference():
    inputs = _inputs(200, n_k_heads=2, n_v_heads=4, dk=64, dv=64, seed=6)
    out, final = gated_delta_rule(*[x.cuda() for x in inputs])
    ref_out, ref_state = gated_delta_rule_f64(*inputs)
    assert _rel(out.cpu().double(), ref_out) < 1e-5 and _rel(final.cpu().double(), ref_state) < 1e-5
