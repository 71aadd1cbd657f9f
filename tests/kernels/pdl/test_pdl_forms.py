"""STRATA_PDL's plumbing (kernels/pdl.py): which launches of a decode step take programmatic dependent launch, and
that each kernel's PDL form (its loads reordered around the grid dependency wait) computes the default form's
bytes. On the CPU, Triton's interpreter runs the PDL form with the wait and the trigger as no-ops (it cannot run
`griddepcontrol`), CPU tensors taking the launch options through FORCE_ON_CPU; test_pdl_build.py checks where
the instructions sit in the sm_90 builds."""

import dataclasses

import numpy as np
import pytest
import torch

from strata import switches
from strata.errors import StrataError
from strata.kernels import pdl
from strata.kernels.attention import decode_short
from strata.kernels.moe import oneshot_gemv, wide_gemv
from strata.kernels.pointwise import add_norm_route, add_rms_norm, qk_norm_rope_store, rms_norm, shared_gate_add_norm
from tests.kernels import DEVICE
from tests.kernels.pointwise.common import rand

SPIED = [(add_rms_norm, "_add_rms_norm_kernel"), (rms_norm, "_rms_norm_kernel"),
         (add_norm_route, "_add_norm_route_kernel"), (qk_norm_rope_store, "_qk_norm_rope_store_kernel"),
         (decode_short, "_decode_short_kernel"), (oneshot_gemv, "_oneshot_down_kernel"),
         (oneshot_gemv, "_oneshot_gate_up_kernel"), (wide_gemv, "_split_sum_kernel"),
         (shared_gate_add_norm, "_shared_gate_add_norm_kernel")]
PDL_KEYS = ("PDL", "launch_pdl", "AHEAD")


class _Spy:
    """Stands in for a kernel: records each launch's name and PDL keywords, then launches the kernel."""

    def __init__(self, name, kernel, log):
        self.name, self.kernel, self.log = name, kernel, log

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def run(*args, **kwargs):
            self.log.append((self.name, {k: kwargs[k] for k in PDL_KEYS if k in kwargs}))
            return launch(*args, **kwargs)

        return run


@pytest.fixture
def launches(monkeypatch):
    log = []
    for module, name in SPIED:
        monkeypatch.setattr(module, name, _Spy(name, getattr(module, name), log))
    monkeypatch.setattr(pdl, "FORCE_ON_CPU", True)  # CUDA tensors take the options by themselves (sm_90+)
    return log


def _step_kernels():
    """The launches of an A3B-like decode layer at tiny sizes: (name, outputs) per call, outputs made fresh."""
    from strata.bench.moe_decode import routing, synthetic_stack
    from strata.kernels.attention.decode import decode_attn_dense_triton
    from strata.kernels.attention.decode_short import ShortConfig
    from strata.kernels.moe.gemv import DecodeExperts, ExpertOperand, GemvConfig, launch_down, moe_gemv_triton
    from strata.kernels.quant.matvec import one_expert
    from strata.quant import get_format, random_blocks

    dt = torch.bfloat16
    h, delta = rand((1, 64), 1, dt, 2), rand((1, 64), 2, dt, 2)
    norm = (1 + 0.1 * rand((64,), 3, torch.float32)).to(dt)
    yield "add_rms_norm", add_rms_norm.add_rms_norm_triton(h, delta, norm, 1e-6)
    yield "rms_norm", (rms_norm.rms_norm_triton(h, norm, 1e-6),)
    gate = rand((64,), 15, dt, 0.1)
    yield "shared_gate_add_norm", shared_gate_add_norm.shared_gate_add_norm_triton(h, delta, delta * 0.5, h, gate,
                                                                                    norm, 1e-6)
    router = rand((8, 64), 4, dt, 0.1)
    yield "add_norm_route", add_norm_route.add_norm_route_triton(h, delta, norm, router, 1e-6, 2, True)
    yield "add_norm_route (router just made)", add_norm_route.add_norm_route_triton(
        h, delta, norm, router, 1e-6, 2, True, router_kept=False)
    q, k, v = rand((1, 4, 32), 5, dt, 2), rand((1, 2, 32), 6, dt, 2), rand((1, 2, 32), 7, dt, 2)
    keys, values = (rand((64, 2, 32), s, torch.float16) for s in (8, 9))
    cos, sin = rand((1, 32), 10, dt), rand((1, 32), 11, dt)
    position = torch.tensor([39], dtype=torch.int32, device=DEVICE)
    turned = qk_norm_rope_store.qk_norm_rope_store_dense(q, k, v, norm[:32], norm[32:], 1e-6, cos, sin, keys, values,
                                                         position)
    yield "qk_norm_rope_store", (turned, keys, values)
    width = position + 1
    # 4 programs a KV head over the span, 3 of them sharing the row's 40 cells: the counted merge
    yield "decode_short", (decode_attn_dense_triton(turned, keys, values, width, 64, out_dtype=dt,
                                                    short=ShortConfig(cells=16, chunk=16)),)
    info = get_format("Q4_0")
    raw = torch.from_numpy(random_blocks("Q4_0", 48 * 64 // 32, np.random.default_rng(12), 0.02)).to(DEVICE)
    matrix = ExpertOperand(raw, info.ggml_type, 48, 64, stride=0)
    oneshot = GemvConfig(bn=16, ns=4, warps=4, wide=True, oneshot=True)
    yield "matvec", (launch_down(h.reshape(1, 1, 64), *one_expert(torch.device(DEVICE), 1), matrix, None, dt,
                                 oneshot),)
    yield "matvec, 2 slices", (launch_down(h.reshape(1, 1, 64), *one_expert(torch.device(DEVICE), 1), matrix, None,
                                           dt, dataclasses.replace(oneshot, split=2)),)
    experts = DecodeExperts.of_stack(synthetic_stack("Q4_0", "Q4_0", 4, 64, 64, seed=13, device=DEVICE))
    ids, weights = routing(1, 2, 4, torch.Generator().manual_seed(14))
    ids, weights = ids.to(torch.int32).to(DEVICE), weights.to(DEVICE)
    yield "experts", (moe_gemv_triton(h, ids, weights, experts, torch.float32,
                                      (dataclasses.replace(oneshot, bn=32), oneshot)),)


def _run(log):
    """{case: (outputs, launches)} of one pass over the cases."""
    results = {}
    for name, outputs in _step_kernels():
        results[name] = ([t.clone() for t in outputs], log[:])
        log.clear()
    return results


@pytest.mark.parametrize("mode", [1, 2, 3])
def test_the_switch_puts_the_step_kernels_on_pdl_with_the_default_bytes(launches, mode):
    with switches.override(STRATA_PDL=0):
        default = _run(launches)
    for name, (_, calls) in default.items():
        assert calls and all(kw == {} for _, kw in calls), (name, calls)  # off: each launch exactly as before PDL
    with switches.override(STRATA_PDL=mode):
        forms = _run(launches)
    assert forms.keys() == default.keys()
    for name, (outputs, calls) in forms.items():
        assert [kernel for kernel, _ in calls] == [kernel for kernel, _ in default[name][1]], name
        for got, want in zip(outputs, default[name][0]):
            assert torch.equal(got, want), name  # the same sums in another instruction order: the same bytes
        if name == "add_norm_route (router just made)":  # read before the wait: no PDL where a kernel just made it
            assert calls == [("_add_norm_route_kernel", {})]
            continue
        for kernel, kw in calls:
            # mode 3: the experts' gate/up triggers past its wait (2), so that their down may read the routing ahead
            late = mode == 2 or (mode == 3 and kernel == "_oneshot_gate_up_kernel")
            ahead = 0
            if kernel == "_oneshot_down_kernel":  # the dense weight, never written; mode 3: the experts' routing too
                ahead = 1 if name.startswith("matvec") else 2 if mode == 3 else 0
            assert (kw["PDL"], kw["launch_pdl"], kw.get("AHEAD", 0)) == (2 if late else 1, True, ahead), (name, kw)
    assert [k for k, _ in forms["matvec, 2 slices"][1]] == ["_oneshot_down_kernel", "_split_sum_kernel"]
    assert [k for k, _ in forms["experts"][1]] == ["_oneshot_gate_up_kernel", "_oneshot_down_kernel"]


def test_the_switch_is_checked_and_left_to_gpus_that_have_pdl():
    x = torch.zeros(4)
    with switches.override(STRATA_PDL=1):
        assert pdl.mode() == 1 and pdl.launch_options(x) == {}  # a CPU tensor: no PDL (the interpreter's forms)
    with switches.override(STRATA_PDL=4):
        with pytest.raises(StrataError, match="STRATA_PDL"):
            pdl.launch_options(x)
    assert pdl.launch_options(x) == {}  # unset


def test_a_router_converted_once_is_kept_and_then_read_before_the_wait():
    from strata.models.weights import QuantWeight

    raw = torch.randn(8, 64).view(torch.uint8)
    router = QuantWeight("router", 0, (8, 64), raw)  # F32, as GGUF routers are
    assert router.kept_as(torch.float32) and not router.kept_as(torch.bfloat16)
    router.dequantize(torch.bfloat16)  # a CPU tensor's conversion is not kept (only on a GPU, outside a capture)
    assert not router.kept_as(torch.bfloat16)
    router._converted[torch.bfloat16] = router.dequantize(torch.bfloat16)
    assert router.kept_as(torch.bfloat16)


def test_weights_made_by_a_queued_kernel_are_settled_before_a_launch_reads_them_ahead(monkeypatch):
    w = torch.zeros(4)
    assert pdl.weights_settled(w, fresh=True)  # unset: nothing is read ahead
    monkeypatch.setattr(pdl, "FORCE_ON_CPU", True)
    with switches.override(STRATA_PDL=1):
        assert pdl.weights_settled(w, fresh=False) and pdl.weights_settled(w, fresh=True)  # the CPU's op is done
