"""Build the misses' gather launch (`miss_copy._copy_misses_kernel`) for sm_90 without a GPU and print its PTX's
global loads and stores by width, as JSON (test_miss_copy.py runs this in a process without TRITON_INTERPRET)."""

import json
import os
import re

os.environ.pop("TRITON_INTERPRET", None)
import triton  # noqa: E402  (before strata.kernels, which would switch the interpreter on)
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from strata.kernels.moe.miss_copy import DEFAULT_COPY, _copy_misses_kernel  # noqa: E402

# qwen4exp's Q2_0 expert: gate / up / down of 460800 bytes each, 115200 int32 words; top 10; strides and pointers
# specialized as a launch's are (divisible by 16).
SIGNATURE = {"ids": "*i32", "missing": "*i32", "table": "*i32", "wg": "*i32", "wu": "*i32", "wd": "*i32",
             "scratch": "*i32", "stride_g": "i64", "stride_u": "i64", "stride_d": "i64", "slot_words": "i64"}
CONSTANTS = dict(PAIRS=10, PAIRS_P2=16, WORDS_G=115200, WORDS_D=115200, CHUNK=DEFAULT_COPY.chunk, FIRST_PART=0)

if __name__ == "__main__":
    kernel = _copy_misses_kernel
    aligned = {(kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name in SIGNATURE}
    signature = {**SIGNATURE, **{name: "constexpr" for name in CONSTANTS}}
    ptx = triton.compile(ASTSource(kernel, signature, CONSTANTS, aligned), target=GPUTarget("cuda", 90, 32),
                         options=dict(num_warps=DEFAULT_COPY.warps)).asm["ptx"]
    loads = re.findall(r"ld\.global\S*", ptx)
    stores = re.findall(r"st\.global\S*", ptx)
    print(json.dumps({"loads": loads, "stores": stores}))
