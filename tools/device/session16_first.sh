#!/usr/bin/env bash
# Session 16's first call (one H200, ~6 minutes: timeout_s 420; carry .whl and .devcache). Issue 4: the A3B
# all-resident step with the routing's top-k by ranks (default path) and o's input rounded in the decode attention's
# epilogue (STRATA_DP4A; both reverted after calls 1-2: commits ff88c57 and 44d40e6 hold them): their CUDA tests,
# the top-k forms side by side (bench decode-attn), the dp4a wiring check, the step times under the default,
# STRATA_DP4A and STRATA_DP4A + STRATA_DP4A_SPLIT, and the per-place critical path (profile_decode.py --increments)
# under the default and the split form.
set -uo pipefail
BUDGET=${BUDGET:-360}
source tools/device/parts.sh || exit 1
A=$A3B
make_a3b_bg && BUDGET=$((BUDGET + 60))
part tests 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/attention/test_decode_short.py \
  tests/kernels/pointwise/test_rms_norm_rope.py tests/kernels/pointwise/test_add_norm_route.py
part route 40 python3 -m strata bench decode-attn --spans 256 --fill 0.5
wait_file $A 200
part wire 60 python3 tools/device/dp4awire_check.py $A --split
B=$A3B_RESIDENT
part bench_default 40 $B
part bench_dp4a 40 env STRATA_DP4A=1 $B
part bench_split 40 env STRATA_DP4A=1 STRATA_DP4A_SPLIT=1 $B
P="python3 tools/device/profile_decode.py $A --steps 8 --vram-budget 24 --increments"
part inc_default 50 $P
part inc_split 50 env STRATA_DP4A=1 STRATA_DP4A_SPLIT=1 $P
finish 30
