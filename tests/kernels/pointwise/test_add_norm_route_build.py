"""The routing launch (add_norm_route.py) built for sm_90 without a GPU (Triton's bundled ptxas), at the warps its
launch takes: one program an expert, one warp a 2,048 values. At A3B's row (2,048, 128 experts, top-8),
qwen3next's (2,048, 512, top-10) and qwen4exp's (2,560: two warps, 512, top-10), with and without STRATA_DP4A's
codes: no spills, and at one warp its reductions need no barriers across warps (at two or more its 19 block-wide
reductions took 63 barriers)."""

import json
import os
import re

if __name__ == "__main__":  # building for the GPU: Triton imported before strata.kernels can switch the interpreter on
    os.environ.pop("TRITON_INTERPRET", None)
    import triton

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.kernels.sm90 import builds_of, cubin_report, needs_ptxas  # noqa: E402

SHAPES = [(2048, 128, 8), (2048, 512, 10), (2560, 512, 10)]  # (columns, experts, top-k): A3B, qwen3next, qwen4exp


def build_sm90(n_cols: int, n_experts: int, k: int, quant: bool) -> dict:
    from strata.kernels.pointwise.add_norm_route import DEFAULT, _add_norm_route_kernel, launch_warps

    block = triton.next_power_of_2(n_cols)
    warps = launch_warps(block, DEFAULT)
    signature = dict(h_ptr="*bf16", d_ptr="*bf16", nw_ptr="*bf16", router_ptr="*bf16", res_ptr="*bf16",
                     out_ptr="*bf16", logits_ptr="*fp32", count_ptr="*i32", weights_ptr="*fp32", ids_ptr="*i32",
                     n_cols="i32", n_experts="i32", eps="fp32")
    if quant:
        signature.update(codes_ptr="*i8", scales_ptr="*fp32", sums_ptr="*i32")
    constants = dict(BLOCK=block, EB=DEFAULT.experts_per_program, PROGRAMS=n_experts // DEFAULT.experts_per_program,
                     K=k, NORMALIZE=True, EBLOCK=triton.next_power_of_2(n_experts), KB=triton.next_power_of_2(k),
                     PDL=1, QUANT=int(quant))
    regs, stack, sass = cubin_report(_add_norm_route_kernel, signature, constants, warps, unaligned=("eps",))
    return {"cols": n_cols, "quant": quant, "warps": warps, "regs": regs, "stack": stack,
            "barriers": len(re.findall(r"\sBAR\.", sass))}


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the device tools build and time it")
@needs_ptxas
def test_the_routing_launch_builds_without_spills():
    builds = builds_of(__file__)
    assert len(builds) == 2 * len(SHAPES), builds
    for b in builds:
        assert b["stack"] == 0 and b["regs"] <= 255, b
        if b["warps"] == 1:
            assert b["barriers"] <= 3, b  # the arrival's release (and the codes' store), none a reduction's


if __name__ == "__main__":
    for shape in SHAPES:
        for quant in (False, True):
            print(json.dumps(build_sm90(*shape, quant)), flush=True)
