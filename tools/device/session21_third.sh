#!/usr/bin/env bash
# Session 21's third call (one H200, ~4 minutes: timeout_s 300; carry .whl and .devcache). Issue 4: PDL mode 3
# (the experts' gate/up triggers past its wait, the down kernel reads its routing and issues its weight loads before
# its wait) against the default mode 1 on today's step, last measured in session 8 (1.98 against 1.95 ms then);
# the same engine, each mode's graphs captured afresh, alternating; then mode 3's increments.
set -uo pipefail
BUDGET=${BUDGET:-250}
source tools/device/parts.sh || exit 1
make_a3b_bg && BUDGET=$((BUDGET + 30))
wait_file $A3B 120
part pdl_sweep 120 $A3B_RESIDENT --pdl-sweep 1,3,1,3,2
part inc_mode3 45 env STRATA_PDL=3 python3 tools/device/profile_decode.py $A3B --steps 8 --vram-budget 24 --increments
finish 30
