#!/usr/bin/env bash
# Session 14's fourth call (one H200, ~3 minutes: timeout_s 300; carry .whl and .devcache). Issue 6 with the fused
# Q2_0 default "128x64x8x3hr/128x8x3hro" (the third call: 5.69-5.72 ms at 16K in both repeats): the kernels' CUDA
# tests, then the parity table at 2K / 8K / 16K, twice (the floor is measured in each run).
set -uo pipefail
BUDGET=${BUDGET:-270}
source tools/device/parts.sh || exit 1
part fused_tests_cuda 90 python3 -m pytest -q -p no:cacheprovider tests/kernels/moe/test_fused_q2_0.py \
  tests/kernels/moe/test_fused_q2_0_variants.py tests/kernels/moe/test_prefill.py tests/kernels/moe/test_work_arena.py
part moe_table 80 python3 -m strata bench moe-prefill --only "Q2_0 / Q2_0" --tokens 2048,8192,16384
part moe_table_again 60 python3 -m strata bench moe-prefill --only "Q2_0 / Q2_0" --tokens 16384 --paths mmq,fused
finish 60
