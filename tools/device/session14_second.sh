#!/usr/bin/env bash
# Session 14's second call (one H200, ~4 minutes: timeout_s 330; carry .whl and .devcache). Issue 6 after the fused
# Q2_0 default became "128x32x4x3hr/64x4x3hro" (half tiles, fp16 down rows; the first call: 5.93-6.09 ms at 16K):
# the kernels' CUDA tests, a sweep of the shapes around the new default (two blocks a step "w", stages, the down
# projection's width; the default first, timed cold, and last), then the parity table at 2K / 8K / 16K.
set -uo pipefail
BUDGET=${BUDGET:-300}
source tools/device/parts.sh || exit 1
part fused_tests_cuda 90 python3 -m pytest -q -p no:cacheprovider tests/kernels/moe/test_fused_q2_0.py \
  tests/kernels/moe/test_fused_q2_0_variants.py tests/kernels/moe/test_prefill.py tests/kernels/moe/test_work_arena.py
D=128x32x4x3hr/64x4x3hro
S="$D,128x32x4x3hwr/64x4x3hwro,128x32x4x4hr/64x4x4hro,128x32x4x3hr/64x4x2hro,128x32x4x3hr/128x8x3hro"
S="$S,128x32x4x3hr/32x4x3hro,128x64x8x3hr/64x4x3hro,128x32x4x3hr/64x4x3hwro,$D"
part fused_sweep 110 python3 -m strata bench moe-prefill --only "Q2_0 / Q2_0" --tokens 16384,8192 --paths fused \
  --reps 10 --sweep "$S"
part moe_table 80 python3 -m strata bench moe-prefill --only "Q2_0 / Q2_0" --tokens 2048,8192,16384
finish 60
