"""The one-launch decode attention (decode_short.py) built for sm_90 without a GPU (Triton's bundled ptxas), without
spills: over an int8 cache the native form (the default: one fp16 QK dot per 64 values, V's codes times scales in
fp16, converted without I2F; at A3B's D 128 the QK as two 2-D dots, one a 64 values: 228 registers and 2,163
instructions against the batched dot's 238 and 2,576; chunks of 64; at qwen4exp's D 256 chunks of 32, as 64 spilled 48
bytes) and the tf32x3 form (each (cell, 64 values)'s scale loaded once and broadcast: session 16, 2,538
-> 2,062 instructions, no spill at D 128); the fp16 cache's default (native dots, chunks of 64), and the
STRATA_DECODE_TURN forms over both."""

import json
import os

if __name__ == "__main__":  # building for the GPU: Triton imported before strata.kernels can switch the interpreter on
    os.environ.pop("TRITON_INTERPRET", None)
    import triton  # noqa: F401

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.kernels.sm90 import builds_of, needs_ptxas  # noqa: E402


def build_sm90(int8: bool, dots: str = "native", dim: int = 128, turn: bool = False) -> dict:
    """The kernel at A3B's shape (4 programs a KV head, the split form's merge), as the step launches it; over int8
    codes `dots` "native" (the default) or "tf32x3"; `turn`: STRATA_DECODE_TURN's form (raw q, k, v turned inside)."""
    from strata.kernels.attention.decode_short import DEFAULT, _decode_short_kernel
    from tests.kernels.sm90 import sass_counts

    cache = "*i8" if int8 else "*fp16"
    names = ("q_ptr", "ids_ptr", "width_ptr", "page_table_ptr", "k_ptr", "v_ptr", "ks_ptr", "vs_ptr", "acc_ptr",
             "ml_ptr", "count_ptr", "out_ptr", "cap", "n_kv_heads", "scale_log2")
    types = ("*bf16", "*i32", "*i32", "*i32", cache, cache, "*fp16", "*fp16", "*fp32", "*fp32", "*i32", "*bf16",
             "i32", "i32", "fp32")
    qk = pv = dots
    constants = dict(G=8, BM=16, D=dim, CH=DEFAULT.chunk_for(qk, pv, int8, dim), SPLITS=4, INT8=int8,
                     DENSE=not int8, QK=qk, PV=pv, BY_SPAN=False, PER=0, CELLS=DEFAULT.cells,
                     MAX_SPLITS=DEFAULT.max_splits, PDL=1)
    signature = dict(zip(names, types))
    if turn:
        signature.update(turn_k_ptr="*bf16", turn_v_ptr="*bf16", qw_ptr="*bf16", kw_ptr="*bf16", cos_ptr="*bf16",
                         sin_ptr="*bf16", eps="fp32")
        constants.update(TURN=True, HALF=dim // 2, IN_ORDER=int8)
    regs, stack, executed, _ = sass_counts(_decode_short_kernel, signature, constants, DEFAULT.warps)
    return {"int8": int8, "dots": dots, "dim": dim, "turn": turn, "regs": regs, "stack": stack,
            "instructions": executed}


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the device tools build and time it")
@needs_ptxas
def test_the_kernel_builds_for_sm90_without_spills():
    builds = builds_of(__file__)
    assert len(builds) == 7, builds
    for b in builds:
        assert b["stack"] == 0 and b["regs"] <= 255, b


if __name__ == "__main__":
    for form in ((True, "native", 128), (True, "tf32x3", 128), (False, "native", 128), (True, "native", 256),
                 (False, "native", 128, True), (True, "native", 128, True), (True, "native", 256, True)):
        print(json.dumps(build_sm90(*form)), flush=True)
