#!/usr/bin/env bash
# Session 15's second call (one H200, ~4 minutes): where the all-resident A3B step's critical path goes, kernel by
# kernel (profile_decode.py --increments: under PDL a kernel's duration includes its wait; its end past the ends
# before it is what it adds), with PDL (the default), without, and with the dp4a GEMVs.
set -uo pipefail
BUDGET=${BUDGET:-300}
source tools/device/parts.sh || exit 1
A=$M/a3b.gguf
make_a3b_bg
wait_file $A 200
P="python3 tools/device/profile_decode.py $A --steps 8 --vram-budget 24 --increments"
part inc_pdl 70 $P
part inc_nopdl 70 env STRATA_PDL=0 $P
part inc_dp4a 70 env STRATA_DP4A=1 $P
finish 30
