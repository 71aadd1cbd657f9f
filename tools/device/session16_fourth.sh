#!/usr/bin/env bash
# Session 16's fourth call (one H200, ~5 minutes: timeout_s 420; carry .whl and .ab). Issue 4: the decode
# attention's dot precisions in the A3B step (fp16 cache, bf16 queries), A against B in one run, arms alternating:
# .ab/head (the package at this commit), .ab/qkn (QK "native": q rounded to fp16, exact for bf16 queries), .ab/nat32
# and .ab/nat64 (QK and PV native: P rounded to fp16; chunks of 32 / 64 cells); each made by `git archive HEAD strata
# ':!strata/data' | tar -x -C .ab/ARM` and one edit of decode_short.DEFAULT; then nat64's greedy tokens against the
# split-K kernel's (attn_tokens_check.py --only attn, copied into .ab/nat64/tools/device so it imports that arm).
set -uo pipefail
BUDGET=${BUDGET:-330}
source tools/device/parts.sh || exit 1
A=$A3B
make_a3b_bg && BUDGET=$((BUDGET + 60))
wait_file $A 200
B=$A3B_RESIDENT
ab_rounds 2 40 "head qkn nat32 nat64" $B
part tokens_nat64 80 env -C .ab/nat64 python3 tools/device/attn_tokens_check.py $A --only attn --tokens 24
finish 8
