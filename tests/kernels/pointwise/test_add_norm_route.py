"""An MoE layer's add + norm, router and top-k in one launch (kernels/pointwise/add_norm_route.py): the residual and
the normed row as add_rms_norm_triton gives them, the routing against float64.

Bound: each logit is an fp32 sum rounded to the activation dtype (one step, two under the interpreter, which
truncates), so the chosen experts are float64's where the k-th and (k+1)-th logits stand further apart than that,
and each weight within (STEPS + 1) dtype steps of the largest logit, relative, of float64's."""

import pytest
import torch

from strata import switches
from strata.kernels.attention import decode_short
from strata.kernels.pointwise.add_norm_route import RouteConfig, add_norm_route_triton
from strata.kernels.pointwise.add_rms_norm import add_rms_norm_triton
from tests.kernels.pointwise.common import DEVICE, STEPS, rand, ulp


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows,experts,k,normalize,per_program", [(1, 32, 4, True, 4), (3, 24, 5, False, 8),
                                                                    (2, 16, 16, True, 32)])
def test_against_the_two_kernels_and_float64(dtype, rows, experts, k, normalize, per_program):
    h, delta = rand((rows, 96), 31, dtype, 2), rand((rows, 96), 32, dtype, 2)
    weight = (1 + 0.1 * rand((96,), 33, torch.float32)).to(dtype)
    router = rand((experts, 96), 34, dtype, 0.05)
    got = add_norm_route_triton(h, delta, weight, router, 1e-6, k, normalize, config=RouteConfig(per_program))
    residual, x = add_rms_norm_triton(h, delta, weight, 1e-6)
    assert torch.equal(got[0], residual)
    step = 0 if DEVICE == "cpu" else ulp(dtype)  # compiled, the norm's sum may run in another order
    assert ((got[1].float() - x.float()).abs() <= step * x.float().abs()).all()
    logits = got[1].double() @ router.double().T
    probs = logits.softmax(-1)
    want_w, want_ids = probs.topk(k, -1)
    if normalize:
        want_w = want_w / want_w.sum(-1, keepdim=True)
    weights, ids = got[2], got[3]
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    spread = logits.abs().amax(-1, keepdim=True)
    bound = (STEPS + 1) * ulp(dtype) * spread
    top = logits.sort(-1, descending=True).values
    for r in range(rows):
        if k == experts or (top[r, k - 1] - top[r, k]).item() > 2 * bound[r].item():  # no near-tie at the k-th
            assert sorted(ids[r].tolist()) == sorted(want_ids[r].tolist())
            got_w = dict(zip(ids[r].tolist(), weights[r].tolist()))
            for e, w in zip(want_ids[r].tolist(), want_w[r].tolist()):
                assert abs(got_w[e] - w) <= 2 * bound[r].item() * w + 1e-7
    assert decode_short.arrival_counters(weights.device, 1).abs().sum().item() == 0  # left zero for the next launch


def test_the_decoder_takes_it_unless_switched_off():
    from strata.models import layers
    from strata.models.weights import QuantWeight

    h, delta = rand((1, 64), 35, torch.bfloat16), rand((1, 64), 36, torch.bfloat16)
    weight = torch.ones(64, dtype=torch.bfloat16, device=DEVICE)
    raw = rand((8, 64), 37, torch.float32, 0.1)
    router = QuantWeight("router", 0, (8, 64), raw.view(torch.uint8))  # F32, as GGUF routers are
    layers.FUSED_ON_CPU = True
    try:
        fused = layers.add_norm_route(h, delta, weight, router, 1e-6, 2, True)
        want = layers.route_topk(layers.linear(fused[1], router), 2, True, torch.int32)[1]
        assert fused is not None and sorted(fused[3][0].tolist()) == sorted(want[0].tolist())
        with switches.override(STRATA_ROUTE_SEPARATE=True):
            assert layers.add_norm_route(h, delta, weight, router, 1e-6, 2, True) is None
        assert layers.add_norm_route(h.float(), delta.float(), weight.float(), router, 1e-6, 2, True) is None
    finally:
        layers.FUSED_ON_CPU = False
