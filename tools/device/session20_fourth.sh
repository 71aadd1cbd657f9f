#!/usr/bin/env bash
# Session 20's fourth call (one H200, ~5 minutes: timeout_s 360; carry .whl, .ab and .devcache). Issue 4: the decode
# attention's launch shape in the step (Nsight Compute, call 1: 16 programs of 4 warps, ~633 instructions a warp at
# ~8.7 cycles each: a latency chain), arms alternating (A3B all resident, fp16 KV):
#   base  .ab/base (HEAD)     w8  ShortConfig.warps 8     w2  warps 2     s1  stages 1 (one chunk a program: no
#   pipelining to gain, 38.9 KB of shared memory to set up)
# Make the arms: rm -rf .ab && mkdir -p .ab/base && git archive HEAD strata ':!strata/data' | tar -x -C .ab/base,
#   copies of it with the one default changed in kernels/attention/decode_short.py's ShortConfig.
# then HEAD's int8 KV step for the record.
set -uo pipefail
BUDGET=${BUDGET:-300}
source tools/device/parts.sh || exit 1
make_a3b_bg && BUDGET=$((BUDGET + 60))
wait_file $A3B 240
ab_rounds 2 30 "base w8 w2 s1" $A3B_RESIDENT
part int8 30 env -C .ab/base $A3B_RESIDENT --kv-dtype int8
finish 8
