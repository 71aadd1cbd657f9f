#!/usr/bin/env bash
# Session 19's second call (one H200, ~8 minutes: timeout_s 520; carry .whl and .devcache). Issue 4. The first call
# (session19_first.sh) found q/k/v-only dp4a 1.74 ms against the default's 1.76 and the whole switch 1.91: its
# experts' gate/up (32-row tiles, H rounded in its epilogue: 192 programs, 1.5 an SM) is slower than the float one,
# where session 15's probe ran the same dp4a kernel in 8-row tiles at 6.65 us against the float 8.01. The new
# STRATA_DP4A_PARTS=gate_up runs the experts' gate/up so (float H) and keeps the float down kernel. Arms:
#   default         unset
#   qkv             STRATA_DP4A=1 STRATA_DP4A_SPLIT=1 STRATA_DP4A_PARTS=qkv
#   gate_up         ... STRATA_DP4A_PARTS=gate_up
#   qkv_gate_up     ... STRATA_DP4A_PARTS=qkv,gate_up
# two rounds, then int8 KV default against qkv,gate_up, that arm's increments and greedy tokens against the
# default's, then the sampled draw kernel's first GPU run (ahead_check.py all resident), then the 12 GiB command
# plain against ahead if time is left.
# (A record: the gate_up part measured slower, 1.90 ms against 1.76, and was taken out again after this call; its
# code is commit 8589463's.)
set -uo pipefail
BUDGET=${BUDGET:-440}
source tools/device/parts.sh || exit 1
make_a3b_bg && BUDGET=$((BUDGET + 60))
wait_file $A3B 240
SPLIT="env STRATA_DP4A=1 STRATA_DP4A_SPLIT=1"
for round in 1 2; do
  part default_$round 30 $A3B_RESIDENT
  part qkv_$round 30 $SPLIT STRATA_DP4A_PARTS=qkv $A3B_RESIDENT
  part gate_up_$round 30 $SPLIT STRATA_DP4A_PARTS=gate_up $A3B_RESIDENT
  part qkv_gate_up_$round 30 $SPLIT STRATA_DP4A_PARTS=qkv,gate_up $A3B_RESIDENT
done
part default_int8 30 $A3B_RESIDENT --kv-dtype int8
part qkv_gate_up_int8 30 $SPLIT STRATA_DP4A_PARTS=qkv,gate_up $A3B_RESIDENT --kv-dtype int8
part inc_qkv_gate_up 40 $SPLIT STRATA_DP4A_PARTS=qkv,gate_up python3 tools/device/profile_decode.py $A3B --steps 8 \
  --vram-budget 24 --increments
part tokens_qkv_gate_up 60 env STRATA_DP4A_PARTS=qkv,gate_up python3 tools/device/dp4awire_check.py $A3B --split
part check24 60 python3 tools/device/ahead_check.py $A3B --tokens 64
AT12="python3 -m strata bench decode $A3B --device cuda --vram-budget 12 --ctx 4096 --tokens 256"
part plain12 90 env STRATA_DECODE_AHEAD=0 $AT12
part ahead12 90 $AT12
finish 14
