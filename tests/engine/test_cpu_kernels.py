"""The CPU expert kernels (the SIMD ones with int16 or int8 activations, and the older `blocks` ones) against
float64 on the dequantized weights, within their stated bound.

Bound of one GEMV output i (from `strata.engine.cpu_kernels.activations`): sum_j |W_ij| * 0.51 * dx(j), dx the
step of x's group (amax / 32767 for int16 codes, amax / 127 for int8), plus 1e-5 * sum_j |W_ij x_j| for float32
sums. An expert's bound carries it through SwiGLU (silu is 1.1-Lipschitz) and the down matrix, whose input is
quantized in turn.
"""

import numpy as np
import pytest
import torch

from strata.engine.cpu_kernels import ACCUMULATION_ERROR, HostExperts, gemv, input_error, moe_experts, supported
from strata.engine.cpu_kernels.blocks import FORMATS
from strata.engine.cpu_pool import CPUExpertPool
from strata.engine.experts import ExpertStack, accumulate
from strata.models.weights import QuantWeight
from strata.quant import dequantize, get_format, random_blocks

# (format, input length): the 32-weight formats also get an odd number of blocks, which takes the scalar tail.
GEMV_CASES = [("Q8_0", 512), ("Q8_0", 288), ("Q4_0", 512), ("Q4_0", 288), ("Q4_K", 512), ("Q6_K", 512),
              ("Q2_0", 576)]


def _input_error(x: np.ndarray, qtype, q_max=32767) -> np.ndarray:
    """How far the kernel's int16 (q_max 32767) or int8 (127) copy of x may be from x; exact for a format torch
    computes in float32."""
    ggml_type = get_format(qtype).ggml_type
    return input_error(x, FORMATS[ggml_type][1], q_max) if supported(ggml_type) else np.zeros_like(x)


def _gemv_bound(x: np.ndarray, w64: np.ndarray, qtype, q_max=32767) -> np.ndarray:
    a = np.abs(w64)
    return _input_error(x, qtype, q_max) @ a.T + ACCUMULATION_ERROR * (np.abs(x) @ a.T)


def _matrix(qtype, experts, rows, cols, rng) -> QuantWeight:
    fmt = get_format(qtype)
    raw = random_blocks(qtype, experts * rows * cols // fmt.block_size, rng).reshape(experts, rows, -1)
    return QuantWeight("w", fmt.ggml_type, (experts, rows, cols), torch.from_numpy(raw))


@pytest.mark.parametrize("tokens", [1, 3])
@pytest.mark.parametrize("qtype,n_in", GEMV_CASES)
def test_gemv_vs_float64(qtype, n_in, tokens):
    rng = np.random.default_rng(n_in + tokens)
    w = _matrix(qtype, 1, 40, n_in, rng)[0]
    w64 = w.dequantize().double().numpy()
    x = rng.normal(size=(tokens, n_in)).astype(np.float32)
    x[0, 5] = 9.0  # an outlier widens its group's step
    y = gemv(w.ggml_type, w.raw.numpy(), x)
    err = np.abs(y - x.astype(np.float64) @ w64.T)
    bound = _gemv_bound(x, w64, qtype)
    worst = (err / bound).max()
    assert worst <= 1, f"{qtype}: error {err.max():.3g} exceeds the bound (worst ratio {worst:.3g})"


def _expert_bound(x, g, u, d, types, q_max=32767):
    """|kernel expert - float64 expert| per output, for x [T, embd] and float64 weights g, u [ff, embd], d [embd, ff]."""
    gx, ux = x @ g.T, x @ u.T
    bg, bu = _gemv_bound(x, g, types[0], q_max), _gemv_bound(x, u, types[1], q_max)
    silu = gx / (1 + np.exp(-gx))
    h = silu * ux
    dh = 1.1 * bg * (np.abs(ux) + bu) + np.abs(silu) * bu + 1e-6 * np.abs(h)
    h_hi = np.abs(h) + dh  # the largest the kernel's h can be: its step is at most this one's
    ad = np.abs(d)
    return h @ d.T, dh @ ad.T + _input_error(h_hi, types[2], q_max) @ ad.T + ACCUMULATION_ERROR * (h_hi @ ad.T)


def _stack(types, rng, n_experts=6, embd=512, ff=256):
    return ExpertStack(*(_matrix(t, n_experts, r, c, rng) for t, (r, c) in zip(types, [(ff, embd), (ff, embd), (embd, ff)])))


STACKS = [("Q2_0", "Q2_0", "Q2_0"), ("Q4_K", "Q4_K", "Q6_K"), ("Q8_0", "Q8_0", "Q4_0"), ("Q4_K", "Q4_K", "IQ4_XS")]


# The pool's kernel paths: HostExperts.simd ("i16" by default, "i8" under STRATA_CPU_POOL_INT8, None for `blocks`).
PATHS = {"i16": 32767, "i8": 127, None: 32767}


@pytest.mark.parametrize("path", list(PATHS), ids=["simd-int16", "simd-int8", "blocks"])
@pytest.mark.parametrize("types", STACKS, ids=["/".join(t) for t in STACKS])
def test_swiglu_experts_vs_float64(types, path):
    rng = np.random.default_rng(1)
    stack = _stack(types, rng)
    assert supported(stack.gate.ggml_type) and (types[2] != "IQ4_XS" or not supported(stack.down.ggml_type))
    x = rng.normal(size=(3, 512)).astype(np.float32)
    x[1, 7] = 12.0  # an outlier widens its group's step
    ids = torch.tensor([[0, 2], [2, 5], [1, 2]])
    weights = torch.tensor([[0.7, 0.3], [0.4, 0.6], [0.5, 0.5]])
    routes = {e: (ids == e).nonzero(as_tuple=True) for e in ids.unique().tolist()}
    experts = [2, 0, 5]  # a subset, out of order: expert 1 is computed elsewhere
    host = HostExperts(stack.gate, stack.up, stack.down)
    assert host.simd == ("i16" if types[2] != "IQ4_XS" else None)  # the default; IQ4_XS has no SIMD kernel
    host.simd = path if host.simd else None
    q_max = PATHS[host.simd]
    out = moe_experts(host, torch.from_numpy(x), routes, weights, experts)
    ref, bound = np.zeros((3, 512)), np.zeros((3, 512))
    for e in experts:
        token, slot = routes[e]
        w = [m[e].dequantize().double().numpy() for m in (stack.gate, stack.up, stack.down)]
        y, b = _expert_bound(x[token.numpy()].astype(np.float64), *w, types, q_max)
        r = weights[token, slot].double().numpy()[:, None]
        np.add.at(ref, token.numpy(), r * y)
        np.add.at(bound, token.numpy(), r * b)
    err = np.abs(out.double().numpy() - ref)
    assert (err <= bound).all(), f"{types}: error {err.max():.3g}, worst ratio to the bound {(err / bound).max():.3g}"


def test_pool_matches_the_torch_path_within_the_bound():
    rng = np.random.default_rng(2)
    types = ("Q4_K", "Q4_K", "Q2_0")
    stacks = {0: _stack(types, rng), 3: _stack(types, rng)}
    x = torch.from_numpy(rng.normal(size=(3, 512)).astype(np.float32))
    ids = torch.tensor([[1, 4], [4, 3], [0, 4]])
    weights = torch.softmax(torch.randn(3, 2, generator=torch.Generator().manual_seed(0)), dim=-1)
    routes = {e: (ids == e).nonzero(as_tuple=True) for e in ids.unique().tolist()}
    experts = [4, 0, 3]
    pool = CPUExpertPool(stacks)
    try:
        out = pool.submit(3, x, routes, weights, experts).result()
    finally:
        pool.close()
    old = torch.zeros_like(x)
    accumulate(old, routes, weights, x, stacks[3].expert, experts)  # the dequantize-then-matmul path it replaced
    bound = np.zeros((3, 512))
    for e in experts:
        token, slot = routes[e]
        w = [m[e].dequantize().double().numpy() for m in (stacks[3].gate, stacks[3].up, stacks[3].down)]
        _, b = _expert_bound(x[token].double().numpy(), *w, types)
        np.add.at(bound, token.numpy(), weights[token, slot].double().numpy()[:, None] * b)
    bound += 1e-5 * old.abs().double().numpy()  # the torch path's own float32 rounding
    err = (out - old).abs().double().numpy()
    assert out.dtype == torch.float32 and out.shape == x.shape
    assert (err <= bound).all(), f"error {err.max():.3g}, worst ratio to the bound {(err / bound).max():.3g}"
    assert pool.stats.experts == 3 and pool.stats.bytes == 3 * stacks[3].expert_bytes and pool.stats.seconds > 0
