#!/usr/bin/env bash
# Session 16's fifth call (one H200, ~6 minutes: timeout_s 420; carry .whl). Issue 4: the decode attention's new
# default over a fp16 cache (both dots native, chunks of 64) at this commit: its CUDA tests, the kernel alone beside
# split-K and session 15's default (the sweep's first line) at spans 256 and 2048, greedy tokens against split-K's,
# the A3B step times (default twice, STRATA_DP4A, STRATA_DP4A + STRATA_DP4A_SPLIT) and the per-place critical path.
set -uo pipefail
BUDGET=${BUDGET:-330}
source tools/device/parts.sh || exit 1
A=$A3B
make_a3b_bg && BUDGET=$((BUDGET + 60))
part tests 110 python3 -m pytest -q -p no:cacheprovider tests/kernels/attention/test_decode_short.py
part attn 60 python3 -m strata bench decode-attn --spans 256,2048 --sweep --sweep-spans 2048
wait_file $A 240
B=$A3B_RESIDENT
part default_1 40 $B
part dp4a 40 env STRATA_DP4A=1 $B
part split 40 env STRATA_DP4A=1 STRATA_DP4A_SPLIT=1 $B
part default_2 40 $B
part tokens 60 python3 tools/device/attn_tokens_check.py $A --only attn --tokens 24
part inc_default 40 python3 tools/device/profile_decode.py $A --steps 8 --vram-budget 24 --increments
finish 14
