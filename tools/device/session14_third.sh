#!/usr/bin/env bash
# Session 14's third call (one H200, ~4 minutes: timeout_s 330; carry .whl and .devcache). Issue 6: the fused Q2_0
# kernels' CUDA tests after they learnt the GPU's fp16 default shapes (they assumed int8 bytes: four failed in the
# second call), then the shapes the second call found faster than the default "128x32x4x3hr/64x4x3hro": gate/up at
# 64 features and 8 warps (5.96 ms against 6.18-6.25 at 16K), down at 128 outputs and 8 warps (its kernel 1.85 ms
# against 2.02-2.14), and both; each twice (the default first, timed cold), at 16K and 8K tokens.
set -uo pipefail
BUDGET=${BUDGET:-300}
source tools/device/parts.sh || exit 1
part fused_tests_cuda 90 python3 -m pytest -q -p no:cacheprovider tests/kernels/moe/test_fused_q2_0.py \
  tests/kernels/moe/test_fused_q2_0_variants.py tests/kernels/moe/test_prefill.py tests/kernels/moe/test_work_arena.py
D=128x32x4x3hr/64x4x3hro
S="$D,128x64x8x3hr/64x4x3hro,128x64x8x3hr/128x8x3hro,128x32x4x3hr/128x8x3hro"
part fused_sweep 120 python3 -m strata bench moe-prefill --only "Q2_0 / Q2_0" --tokens 16384,8192 --paths fused \
  --reps 10 --sweep "$S,$S"
finish 60
