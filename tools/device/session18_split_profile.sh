#!/usr/bin/env bash
# Session 18's last call (one H200, ~3 minutes: timeout_s 230; carry .whl and .devcache): where the dp4a split step
# (STRATA_DP4A + STRATA_DP4A_SPLIT: 1.91 ms against the default's 1.76 in call 1; 1.84 against 1.96 in session 15)
# spends its time, kernel by kernel (`profile_decode.py --increments`), to set beside call 1's default increments.
set -uo pipefail
BUDGET=${BUDGET:-150}
source tools/device/parts.sh || exit 1
make_a3b_bg
wait_file $A3B 120
part inc_split 60 env STRATA_DP4A=1 STRATA_DP4A_SPLIT=1 python3 tools/device/profile_decode.py $A3B --steps 8 \
  --vram-budget 24 --increments
finish 14
