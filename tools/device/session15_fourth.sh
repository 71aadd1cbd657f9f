#!/usr/bin/env bash
# Session 15's fourth call (one H200, ~4-5 minutes; carry .whl and .devcache). Issue 4: STRATA_DP4A_SPLIT (the
# dense q/k/v and o matvecs on rows split for 16-byte code loads, models/dp4a_step.py) in the A3B all-resident
# step: bench decode unset, STRATA_DP4A, both switches; greedy tokens and logits against unset (dp4awire_check.py
# --split); the critical path's kernels under both switches (profile_decode.py --increments).
set -uo pipefail
BUDGET=${BUDGET:-300}
source tools/device/parts.sh || exit 1
A=$A3B
make_a3b_bg && BUDGET=$((BUDGET + 60))
part tests 40 python3 -m pytest -q -p no:cacheprovider tests/kernels/quant/test_q4_0_split.py
wait_file $A 200
B=$A3B_RESIDENT
part bench_unset 50 $B
part bench_dp4a 50 env STRATA_DP4A=1 $B
part bench_split 50 env STRATA_DP4A=1 STRATA_DP4A_SPLIT=1 $B
part check_split 70 python3 tools/device/dp4awire_check.py $A --tokens 32 --prompt-tokens 32 --split
part inc_split 50 env STRATA_DP4A=1 STRATA_DP4A_SPLIT=1 python3 tools/device/profile_decode.py $A --steps 8 \
  --vram-budget 24 --increments
finish 24
