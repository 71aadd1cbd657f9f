#!/usr/bin/env bash
# Session 20's first call (one H200, ~7 minutes: timeout_s 480; carry .whl and .devcache). Issue 4: the A3B
# all-resident step's kernels under Nsight Compute, for what bounds each (session 19's leave-out table gave each
# stage's share; this asks why): two layers' kernels of a captured step (graph nodes, profiled one at a time, the L2
# flushed before each as ncu does by default), with throughput, issue, stall-reason, occupancy and instruction
# sections; the default path, then the dp4a split path (every part). First the step's time unprofiled, for scale.
set -uo pipefail
BUDGET=${BUDGET:-420}
source tools/device/parts.sh || exit 1
make_a3b_bg && BUDGET=$((BUDGET + 60))
wait_file $A3B 240
part default 40 $A3B_RESIDENT
NCU="ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
  --section LaunchStats --section Occupancy --section InstructionStats --section MemoryWorkloadAnalysis"
SHORT="$A3B --device cuda --vram-budget 24 --ctx 4096 --tokens 16"
# 8 matching kernels a layer (the store, the attention, o, the routing, gate/up, down, the closing norm, q/k/v);
# 2,000 skipped: past the prompt and the first steps
part ncu_default 150 $NCU -k "regex:oneshot|decode_short|add_norm_route|qk_norm_rope_store|add_rms_norm" \
  --launch-skip 2000 --launch-count 16 -o $L/default python3 -m strata bench decode $SHORT
part ncu_dp4a 150 env STRATA_DP4A=1 STRATA_DP4A_SPLIT=1 $NCU -k "regex:dp4a|quantize" \
  --launch-skip 1500 --launch-count 10 -o $L/dp4a python3 -m strata bench decode $SHORT
for r in default dp4a; do
  [ -f $L/$r.ncu-rep ] && ncu --import $L/$r.ncu-rep --page details > $L/details_$r.log 2>&1
done
finish 6
