#!/usr/bin/env bash
# Session 16's third call (one H200, ~5 minutes: timeout_s 420; carry .whl and .ab). Issue 4: the decode attention
# at the A3B bench's short spans (span 256, widths 65-140): the one-launch kernel's configs swept alone
# (`bench decode-attn --sweep` at span 256, widths 50 % and 25 % of it), then the step itself with the default's
# cells a program changed, A against B in one run (arms alternating): .ab/head (the package at this commit), .ab/c128
# (cells 128: 2 programs a KV head at span 256), .ab/c256 (cells 256: 1, no merge), .ab/c128ch64 (cells 128, chunks
# of 64); each made by `git archive HEAD strata ':!strata/data' | tar -x -C .ab/ARM` and one edit of DEFAULT.
set -uo pipefail
BUDGET=${BUDGET:-330}
source tools/device/parts.sh || exit 1
A=$A3B
make_a3b_bg && BUDGET=$((BUDGET + 60))
part sweep50 50 python3 -m strata bench decode-attn --spans 256 --fill 0.5 --sweep --sweep-spans 256
part sweep25 40 python3 -m strata bench decode-attn --spans 256 --fill 0.25 --sweep --sweep-spans 256
wait_file $A 200
B=$A3B_RESIDENT
ab_rounds 2 40 "head c128 c256 c128ch64" $B
finish 6
