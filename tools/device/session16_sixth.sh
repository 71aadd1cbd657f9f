#!/usr/bin/env bash
# Session 16's sixth call (one H200, ~4 minutes: timeout_s 340; carry .whl and .ab). Issue 4, for the planners: the
# decode attention with at most 8 programs a KV head (.ab/ms8; alone at span 2048 it took 7.75 us against 8.82) in
# the A3B step after a 1,200-token prompt (span 2048) against the package at this commit (.ab/head), arms
# alternating; and the step over an int8 KV cache beside the fp16 one (64-token prompt; the int8 cache's decode
# attention is still tf32x3: what an exact int8 form of the native dots could take).
set -uo pipefail
BUDGET=${BUDGET:-250}
source tools/device/parts.sh || exit 1
A=$A3B
make_a3b_bg && BUDGET=$((BUDGET + 60))
wait_file $A 200
B=$A3B_RESIDENT
ab_rounds 2 35 "head ms8" $B --prompt-tokens 1200
part fp16 35 $B
part int8 35 $B --kv-dtype int8
finish 6
