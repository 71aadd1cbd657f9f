#!/usr/bin/env bash
# Session 16's second call (one H200, ~5 minutes: timeout_s 400; carry .whl, .devcache and .ab). Issue 4: o's input
# rounded in the decode attention's epilogue (STRATA_DP4A), A against B in one run: .ab/base holds the package at
# 8384b0c (session 15's last commit; make it with `git archive 8384b0c strata ':!strata/data' | tar -x -C .ab/base`),
# the working tree is B. The arms alternate so that the machine's drift falls on both; the default path (the same
# code in both arms) measures the noise.
set -uo pipefail
BUDGET=${BUDGET:-330}
source tools/device/parts.sh || exit 1
A=$A3B
make_a3b_bg && BUDGET=$((BUDGET + 60))
wait_file $A 200
B=$A3B_RESIDENT
part which 20 env -C .ab/base python3 -c "import strata; print('base arm imports', strata.__file__)"
for round in 1 2; do
  part split_base$round 40 env -C .ab/base STRATA_DP4A=1 STRATA_DP4A_SPLIT=1 $B
  part split_new$round 40 env STRATA_DP4A=1 STRATA_DP4A_SPLIT=1 $B
  part dp4a_base$round 40 env -C .ab/base STRATA_DP4A=1 $B
  part dp4a_new$round 40 env STRATA_DP4A=1 $B
done
part default_base 40 env -C .ab/base $B
part default_new 40 $B
P="python3 tools/device/profile_decode.py $A --steps 8 --vram-budget 24 --increments"
part inc_split_new 40 env STRATA_DP4A=1 STRATA_DP4A_SPLIT=1 $P
finish 12
