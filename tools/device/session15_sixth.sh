#!/usr/bin/env bash
# Session 15's sixth call (one H200, ~3 minutes; carry .whl and .devcache). Issue 4: STRATA_DP4A_SPLIT as committed
# (o's input rounded by quantize_x again) in the A3B all-resident step under each PDL mode, and the quant kernels'
# CUDA tests.
set -uo pipefail
BUDGET=${BUDGET:-200}
source tools/device/parts.sh || exit 1
A=$A3B
make_a3b_bg && BUDGET=$((BUDGET + 60))
part tests 40 python3 -m pytest -q -p no:cacheprovider tests/kernels/quant
wait_file $A 150
B=$A3B_RESIDENT
for mode in 1 2 3; do
  part split_pdl$mode 40 env STRATA_DP4A=1 STRATA_DP4A_SPLIT=1 STRATA_PDL=$mode $B
done
finish 12
