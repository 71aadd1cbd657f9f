"""The SIMD row kernels of the CPU expert pool: every ISA variant this CPU runs gives the same bytes, within the
float64 bound (see test_cpu_kernels for its terms); the activation codes are the ones the bound assumes; the pool's
switches and thread count pick kernels without changing what the default computes."""

import numba
import numpy as np
import pytest
import torch

from strata import switches
from strata.engine.cpu_kernels import ACCUMULATION_ERROR, HostExperts, input_error, moe_experts
from strata.engine.cpu_kernels.activations import quantize_rows
from strata.engine.cpu_kernels.blocks import FP16
from strata.engine.cpu_kernels.simd_ir import LAYOUT
from strata.engine.cpu_kernels.simd_pool import Q_MAX, host_isa, quantize_codes, row_function
from strata.engine.cpu_pool import CPUExpertPool, pool_threads
from strata.errors import StrataError
from strata.models.weights import QuantWeight
from strata.quant import get_format, random_blocks
from tests.engine.test_cpu_kernels import _stack

# Each format at an input length with an odd count of blocks (or super-blocks), which takes the kernels' tail.
CASES = [("Q8_0", 288), ("Q4_0", 288), ("Q4_K", 768), ("Q6_K", 768), ("Q2_0", 576)]
ISAS = ("vnni", "avx2", "generic")


def _variants() -> list[str]:
    """The host's variant and those below it (generic runs anywhere)."""
    return list(ISAS[ISAS.index(host_isa()):])


def _codes(x: np.ndarray, fmt: str, act: str):
    group, interleave = LAYOUT[fmt][2:]
    q = np.empty(x.shape, np.int8 if act == "i8" else np.int16)
    step = np.empty((x.shape[0], x.shape[1] // group), np.float32)
    sums = np.empty(step.shape, np.int32)
    quantize_codes(x, group, interleave, Q_MAX[act], q, step, sums)
    return q, step, sums


@pytest.mark.parametrize("act", ["i16", "i8"])
@pytest.mark.parametrize("fmt,n_in", CASES)
def test_row_kernels_vs_float64_and_across_isa(fmt, n_in, act):
    rng = np.random.default_rng(n_in)
    spec = get_format(fmt)
    n_rows = 21
    raw = random_blocks(fmt, n_rows * n_in // spec.block_size, rng).reshape(n_rows, -1)
    w64 = QuantWeight("w", spec.ggml_type, (n_rows, n_in), torch.from_numpy(raw)).dequantize().double().numpy()
    x = rng.normal(size=(1, n_in)).astype(np.float32)
    x[0, 3] = -7.5  # an outlier widens its group's step
    q, step, sums = _codes(x, fmt, act)
    outputs = {}
    for isa in _variants():
        y = np.full(n_rows + 1, 123.0, np.float32)  # one past the end: the kernel must not write there
        row_function(fmt, act, isa)(raw.ctypes.data, raw.shape[1], n_rows, q.ctypes.data, step.shape[1],
                                    FP16.ctypes.data, step.ctypes.data, sums.ctypes.data, y.ctypes.data)
        assert y[n_rows] == 123.0
        outputs[isa] = y[:n_rows]
    for isa, y in outputs.items():  # exact integer dots, the same float32 operations in the same order
        assert y.tobytes() == outputs["generic"].tobytes(), f"{fmt} {act}: {isa} differs from generic"
    a = np.abs(w64)
    bound = input_error(x, LAYOUT[fmt][2], Q_MAX[act]) @ a.T + ACCUMULATION_ERROR * (np.abs(x) @ a.T)
    err = np.abs(outputs["generic"] - x.astype(np.float64) @ w64.T)
    assert (err <= bound).all(), f"{fmt} {act}: worst ratio to the bound {(err / bound).max():.3g}"


@pytest.mark.parametrize("group,interleave", [(32, 1), (64, 4)])
def test_activation_codes_are_the_int16_codes_and_within_half_a_step(group, interleave):
    rng = np.random.default_rng(group)
    x = rng.normal(size=(3, 4 * group)).astype(np.float32)
    x[1, :group] = 0  # an all-zero group: step 0, codes 0
    x[2, 5] = 40.0
    q16 = np.empty(x.shape, np.int16)
    step = np.empty((3, 4), np.float32)
    sums = np.empty((3, 4), np.int32)
    quantize_codes(x, group, interleave, 32767, q16, step, sums)
    old = quantize_rows(x, group, interleave)  # the `blocks` kernels' codes: the same numbers
    assert np.array_equal(q16, old.q) and np.array_equal(step, old.step) and np.array_equal(sums, old.sums)
    for act in ("i8", "i16"):
        q, step, sums = _codes(x, "Q2_0" if interleave > 1 else "Q8_0", act)
        plain = q.reshape(3, 4, interleave, group // interleave).swapaxes(-1, -2).reshape(3, -1)  # undo the order
        back = plain.astype(np.float64) * np.repeat(step, group, axis=1)
        assert (np.abs(back - x) <= input_error(x, group, Q_MAX[act])).all()
        assert np.array_equal(sums, plain.reshape(3, 4, group).sum(-1)) and np.abs(q).max() <= Q_MAX[act]
        assert not q[1, :group].any() and step[1, 0] == 0


def _layer(rng):
    stack = _stack(("Q4_K", "Q4_K", "Q6_K"), rng, n_experts=5, embd=512, ff=256)
    x = torch.from_numpy(rng.normal(size=(4, 512)).astype(np.float32))
    ids = torch.tensor([[0, 3], [3, 4], [1, 3], [4, 0]])
    weights = torch.softmax(torch.randn(4, 2, generator=torch.Generator().manual_seed(1)), dim=-1)
    routes = {e: (ids == e).nonzero(as_tuple=True) for e in ids.unique().tolist()}
    return stack, x, routes, weights, [3, 0, 4, 1]


def test_switches_pick_the_kernels():
    rng = np.random.default_rng(5)
    stack, x, routes, weights, experts = _layer(rng)
    outs = {}
    for name, values in (("default", {}), ("i8", {"STRATA_CPU_POOL_INT8": True}), ("old", {"STRATA_CPU_POOL_OLD": True})):
        with switches.override(**values):
            host = HostExperts(stack.gate, stack.up, stack.down)
            outs[name] = (host.simd, moe_experts(host, x, routes, weights, experts).numpy().tobytes())
    assert [outs[k][0] for k in ("default", "i8", "old")] == ["i16", "i8", None]
    host = HostExperts(stack.gate, stack.up, stack.down)
    host.simd = None  # the `blocks` kernels, reached without the switch: the same bytes as under it
    assert moe_experts(host, x, routes, weights, experts).numpy().tobytes() == outs["old"][1]
    assert len({b for _, b in outs.values()}) == 3  # three different kernels, three different roundings


def test_pool_output_does_not_depend_on_its_thread_count():
    rng = np.random.default_rng(6)
    stack, x, routes, weights, experts = _layer(rng)
    results = []
    for threads in (1, numba.config.NUMBA_NUM_THREADS):  # each output row is one work item's, whoever runs it
        pool = CPUExpertPool({0: stack}, threads=threads)
        try:
            results.append(pool.submit(0, x, routes, weights, experts).result().numpy().tobytes())
        finally:
            pool.close()
    assert len(set(results)) == 1
    with pytest.raises(StrataError, match="cpu_threads"):
        pool_threads(-1)


def test_reused_buffers_leave_no_trace_between_calls():
    rng = np.random.default_rng(7)
    stack, x, routes, weights, experts = _layer(rng)
    host = HostExperts(stack.gate, stack.up, stack.down)
    first = moe_experts(host, x[:1], routes_of(routes, 1), weights[:1], [3, 0]).numpy().tobytes()
    moe_experts(host, x, routes, weights, experts)  # more rows: the buffers grow, then hold other numbers
    assert moe_experts(host, x[:1], routes_of(routes, 1), weights[:1], [3, 0]).numpy().tobytes() == first


def routes_of(routes: dict, n_tokens: int) -> dict:
    """The routes restricted to the first n_tokens tokens."""
    kept = {e: (t[t < n_tokens], s[t < n_tokens]) for e, (t, s) in routes.items()}
    return {e: r for e, r in kept.items() if len(r[0])}
