"""The one-launch sampled draw (kernels/sample/draw.py) built for sm_90 without a GPU (Triton's bundled ptxas), at
the default top-k's 20 candidates (one warp) and at its limit (64, four warps), with both filters: no spills."""

import json
import os

if __name__ == "__main__":  # building for the GPU: Triton imported before strata.kernels can switch the interpreter on
    os.environ.pop("TRITON_INTERPRET", None)
    import triton

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.kernels.sm90 import builds_of, cubin_report, needs_ptxas  # noqa: E402


def build_sm90(k: int) -> dict:
    from strata.kernels.sample.draw import _draw_kernel, warps_for

    signature = dict(values="*fp32", ids="*i64", out="*i64", n="i32", top_p="fp32", min_p="fp32", u="fp32")
    constants = dict(BLOCK=triton.next_power_of_2(k), TOP_P=True, MIN_P=True)
    regs, stack, _ = cubin_report(_draw_kernel, signature, constants, warps_for(k),
                                  unaligned=("n", "top_p", "min_p", "u"))
    return {"k": k, "regs": regs, "stack": stack}


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the device tools build and time it")
@needs_ptxas
def test_the_draw_builds_without_spills():
    builds = builds_of(__file__)
    assert [b["k"] for b in builds] == [20, 64]
    for b in builds:
        assert b["stack"] == 0 and b["regs"] <= 255, b


if __name__ == "__main__":
    for k in (20, 64):
        print(json.dumps(build_sm90(k)), flush=True)
