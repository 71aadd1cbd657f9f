"""Build the expert kernels for sm_90 (Hopper) without a GPU and print each build's registers and spill stack.

Run as a script in a process without TRITON_INTERPRET (test_sm90_build.py does): Triton then compiles to a cubin
with its bundled ptxas, so the launch configurations of `stack.tile_config` can be checked for spills on CPU.
"""

import json
import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)
import triton  # noqa: E402  (before strata.kernels, which would switch the interpreter on)
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from strata.kernels.moe import combine, dense, expert_gather, fused, fused_q2_0, grouping, mmq, quantize32  # noqa: E402
from strata.kernels.moe.decode import SPECS  # noqa: E402
from strata.kernels.moe.stack import tile_config  # noqa: E402

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
GROUPED = {"row_token": "*i32", "tile_expert": "*i32", "n_tiles": "*i32"}
INT8_ROWS = {"a": "*i8", "a_scale": "*fp32", "a_sum": "*i32"}


def build(kernel, signature: dict, constants: dict, **options) -> dict:
    # Arguments specialized as a launch would: pointers and sizes divisible by 16 (the layer's shapes are).
    aligned = {(kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name in signature}
    signature = {**signature, **{name: "constexpr" for name in constants}}
    compiled = triton.compile(ASTSource(kernel, signature, constants, aligned), target=GPUTarget("cuda", 90, 32),
                              options=options)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([CUOBJDUMP, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    regs, stack = re.search(r"REG:(\d+) STACK:(\d+)", usage).groups()
    return {"kernel": kernel.__name__, "regs": int(regs), "stack": int(stack), **{
        k: v for k, v in constants.items() if k in ("FMT", "K", "BN")}, "warps": options.get("num_warps"),
        "stages": options.get("num_stages")}


def expert_kernels(name: str, n_embd: int = 2560, n_ff: int = 640):
    spec = SPECS[name]
    fmt = dict(FMT=spec.fmt_id, QK=spec.block_size, TS=spec.type_size)
    int8 = dict(fmt, SPLIT16=spec.split16, HAS_MIN=spec.has_min)
    weights = {"w": "*u8", "tab": "*i8"}
    sizes = {"expert_bytes": "i64", "row_bytes": "i32"}
    t = tile_config("mm", spec, n_ff, True)
    mm = {**INT8_ROWS, **GROUPED, **weights, "out": "*fp32", "n_out": "i32", **sizes}
    yield build(mmq._grouped_int8_kernel, mm, dict(K=n_embd, GATHER=True, SHARED64=False, BM=64, BN=t.bn, **int8),
                num_warps=t.warps, num_stages=t.stages)
    if spec.block_size <= 64:  # a format the down projection (K = 640) can use
        yield build(mmq._grouped_int8_kernel, mm, dict(K=n_ff, GATHER=False, SHARED64=spec.scale_per_64, BM=64,
                                                       BN=t.bn, **int8), num_warps=t.warps, num_stages=t.stages)
    if spec.scale_per_64:  # Q2_0 takes the fused path's own kernels
        yield from fused_q2_0_kernels(spec, n_embd, n_ff)
    t = tile_config("gate_up", spec, n_ff, True)
    gate_up = {**INT8_ROWS, **GROUPED, "wg": "*u8", "wu": "*u8", "tab": "*i8", "hq": "*i8", "hs": "*fp32",
               "hsum": "*i32", "n_ff": "i32", **sizes}
    if not spec.scale_per_64:
        yield build(fused._gate_up_kernel, gate_up, dict(K=n_embd, SHARED64=False, BM=64, BN=t.bn, **int8),
                    num_warps=t.warps, num_stages=t.stages)
    t = tile_config("dense", spec, n_ff, True)
    fp16 = {"a": "*fp32", **GROUPED, **weights, "out": "*fp32", "n_out": "i32", **sizes}
    yield build(dense._grouped_fp16_kernel, fp16, dict(K=n_embd, GATHER=True, BM=64, BN=t.bn, **fmt),
                num_warps=t.warps, num_stages=t.stages)


def fused_q2_0_kernels(spec, n_embd: int, n_ff: int, tiles=None):
    """The fused path's Q2_0 gate/up and down kernels at their default shapes (or `tiles`, for the sweep lists)."""
    rows = {"row_token": "*i32", "tile_expert": "*i32", "n_tiles": "*i32"}
    sizes = {"expert_bytes": "i64", "row_bytes": "i32"}
    t = tiles or tile_config("gate_up", spec, n_ff, True)
    td = (tiles.down or tiles) if tiles else tile_config("down", spec, n_embd, True)
    gate_up = {"a": "*fp16" if t.fp16 else "*i8", "a_scale": "*fp32", **rows, "wg": "*u8", "wu": "*u8",
               "hq": "*fp16" if td.fp16 else "*i8", "hs": "*fp32", "hsum": "*i32", "n_ff": "i32", **sizes}
    yield build(fused_q2_0._gate_up_q2_0_kernel, gate_up, dict(K=n_embd, TS=spec.type_size, BM=t.rows, BN=t.bn,
                                                               ONE_DOT=not t.split, MAGIC=t.magic, FP16=t.fp16,
                                                               WIDE=t.wide, H16=td.fp16, HALF=t.half),
                num_warps=t.warps, num_stages=t.stages)
    down = {"h": "*fp16" if td.fp16 else "*i8", "h_scale": "*fp32", **rows, "w": "*u8",
            "out": "*fp16" if td.fp16_out else "*fp32", "n_out": "i32", **sizes}
    yield build(fused_q2_0._down_q2_0_kernel, down, dict(K=n_ff, TS=spec.type_size, BM=td.rows, BN=td.bn,
                                                         ONE_DOT=not td.split, MAGIC=td.magic, FP16=td.fp16,
                                                         WIDE=td.wide, HALF=td.half),
                num_warps=td.warps, num_stages=td.stages)


def helper_kernels():
    yield build(quantize32._quantize_kernel, {"x": "*bf16", "codes": "*i8", "scales": "*fp32", "sums": "*i32",
                                              "n_rows": "i32"}, dict(K=2560, BM=16, BK=256), enable_fp_fusion=False)
    yield build(grouping._count_kernel, {"ids": "*i32", "counts": "*i32", "n_pairs": "i32"}, dict(BLOCK=1024))
    yield build(grouping._scan_kernel, {"counts": "*i32", "starts": "*i32", "fill": "*i32", "tile_expert": "*i32",
                                        "n_tiles": "*i32", "n_experts": "i32", "max_tiles": "i32"},
                dict(BLOCK_E=512, BLOCK_T=32, ROWS=64))
    yield build(grouping._place_kernel, {"ids": "*i32", "fill": "*i32", "pair_row": "*i32", "row_token": "*i32",
                                         "n_pairs": "i32", "top_k": "i32"}, dict(BLOCK=1024))
    yield build(combine._combine_kernel, {"rows_out": "*fp32", "pair_row": "*i32", "weights": "*fp32", "y": "*bf16",
                                          "n_tokens": "i32", "n_out": "i32"}, dict(TOP_K=10, BT=16, BN=256))
    config = expert_gather.GatherConfig()  # the prompt streamer's gather, at the full-size expert's word counts
    yield build(expert_gather._gather_kernel, {"gate": "*i64", "up": "*i64", "down": "*i64", "dst": "*i64",
                                               "pairs": "*i32", "n_tiles": "i32", "tiles_per_expert": "i32",
                                               "gate_words": "i32", "up_words": "i32", "down_words": "i32",
                                               "slot_words": "i32"}, dict(BLOCK=config.block), num_warps=config.warps)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--fused-shapes"]:  # the fused sweep's shapes: registers and spills of each
        from strata.kernels.moe.stack import Tiles
        for text in sys.argv[2:]:
            for result in fused_q2_0_kernels(SPECS["Q2_0"], 2560, 640, Tiles.parse(text)):
                print(json.dumps({"shape": text, **result}), flush=True)
        sys.exit(0)
    for name in sys.argv[1:]:
        for result in (helper_kernels() if name == "helpers" else expert_kernels(name)):
            print(json.dumps(result), flush=True)
