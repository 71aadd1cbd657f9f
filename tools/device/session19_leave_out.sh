#!/usr/bin/env bash
# Session 19's fourth call (one H200, ~6 minutes: timeout_s 420; carry .whl and .devcache). Issue 4: the A3B
# all-resident step with each stage left out (tools/device/leave_out.py: no launch, a zero output), one run each,
# the full step at the start and the end; then all four matvecs gone (what the small kernels' chain costs alone)
# and the small stages gone (what the matvecs cost alone). (Call 4 also ran a `norm` stage, the add + norm closing
# a layer: its capture faulted, and leave_out.py no longer offers it; the small stages' arm then left it out too.)
set -uo pipefail
BUDGET=${BUDGET:-330}
source tools/device/parts.sh || exit 1
make_a3b_bg && BUDGET=$((BUDGET + 60))
wait_file $A3B 240
ARGS="$A3B --device cuda --vram-budget 24 --ctx 4096 --tokens 64"
n=0
for arm in none qkv attn o route gate_up down qkv,o,gate_up,down attn,route gate_up,down none; do
  n=$((n + 1))
  part "leave${n}_${arm//,/+}" 30 python3 tools/device/leave_out.py --leave "${arm/none/}" -- $ARGS
done
finish 3
