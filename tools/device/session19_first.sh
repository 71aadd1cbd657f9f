#!/usr/bin/env bash
# Ready for session 19's first call (one H200, ~8 minutes: timeout_s 540; carry .whl and .devcache). Issue 4, after
# session 18 (default fp16 step 1.76 ms, the wall clock's 1.78 with decode one step ahead). Session 18's increments
# of the dp4a split step (call 10) found only its q/k/v matvec faster than the float kernels (3.61 against 6.06 us a
# layer); its experts' gate/up slower (10.10 against 9.10) and the whole step 1.91 ms. STRATA_DP4A_PARTS (new) picks
# the parts from one package, so the arms are switches, alternating round by round:
#   default   unset
#   qkv       STRATA_DP4A=1 STRATA_DP4A_SPLIT=1 STRATA_DP4A_PARTS=qkv   (the norm before q/k/v writes the codes)
#   qkv_o     the same with o                                           (+ o's quantize_x launch a layer)
#   all       STRATA_DP4A=1 STRATA_DP4A_SPLIT=1                         (session 18: 1.91 ms)
# over fp16 then int8 KV, then the qkv arm's increments and its greedy tokens against the default's
# (dp4awire_check.py --split: the logits' bound as for the whole switch).
set -uo pipefail
BUDGET=${BUDGET:-420}
source tools/device/parts.sh || exit 1
make_a3b_bg && BUDGET=$((BUDGET + 60))
wait_file $A3B 240
SPLIT="env STRATA_DP4A=1 STRATA_DP4A_SPLIT=1"
for round in 1 2; do
  part default_$round 30 $A3B_RESIDENT
  part qkv_$round 30 $SPLIT STRATA_DP4A_PARTS=qkv $A3B_RESIDENT
  part qkv_o_$round 30 $SPLIT STRATA_DP4A_PARTS=qkv,o $A3B_RESIDENT
  part all_$round 30 $SPLIT $A3B_RESIDENT
done
part default_int8 30 $A3B_RESIDENT --kv-dtype int8
part qkv_int8 30 $SPLIT STRATA_DP4A_PARTS=qkv $A3B_RESIDENT --kv-dtype int8
part inc_qkv 40 $SPLIT STRATA_DP4A_PARTS=qkv python3 tools/device/profile_decode.py $A3B --steps 8 --vram-budget 24 \
  --increments
part tokens_qkv 60 env STRATA_DP4A_PARTS=qkv python3 tools/device/dp4awire_check.py $A3B --split
finish 14
