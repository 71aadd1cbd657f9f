#!/usr/bin/env bash
# Ready for session 16's first call (one H200, ~4 minutes: timeout_s 300; carry .whl and .devcache). Issue 4: the
# A3B all-resident step's critical path by place in a layer (profile_decode.py --increments, its per-place table
# new since session 15's calls) under the default and under STRATA_DP4A + STRATA_DP4A_SPLIT, with the step times
# beside them; the split kernel's CUDA tests first.
set -uo pipefail
BUDGET=${BUDGET:-260}
source tools/device/parts.sh || exit 1
A=$M/a3b.gguf
make_a3b_bg && BUDGET=$((BUDGET + 60))
part tests 40 python3 -m pytest -q -p no:cacheprovider tests/kernels/quant/test_q4_0_split.py
wait_file $A 200
P="python3 tools/device/profile_decode.py $A --steps 8 --vram-budget 24 --increments"
part inc_default 50 $P
part inc_split 50 env STRATA_DP4A=1 STRATA_DP4A_SPLIT=1 $P
B="python3 -m strata bench decode $A --device cuda --vram-budget 24 --ctx 4096 --tokens 64"
part bench_default 40 $B
part bench_split 40 env STRATA_DP4A=1 STRATA_DP4A_SPLIT=1 $B
finish 30
