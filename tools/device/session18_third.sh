#!/usr/bin/env bash
# Session 18's third call (one H200, ~6 minutes: timeout_s 450; carry .whl and .devcache). Greedy decode one step
# ahead (STRATA_DECODE_AHEAD, engine/decode_ahead.py, on by default for captured steps): its tokens against the plain
# loop's on the A3B (tools/device/ahead_check.py: 64 tokens, a stopped run and a follow-up on the cache it left),
# then `bench decode` all resident with the plain loop (STRATA_DECODE_AHEAD=0) and ahead alternating over two
# rounds, and once each over the int8 KV cache (also the first timing of the D 128 int8 QK's two dots as committed).
set -uo pipefail
BUDGET=${BUDGET:-330}
source tools/device/parts.sh || exit 1
make_a3b_bg && BUDGET=$((BUDGET + 60))
wait_file $A3B 240
part check 90 python3 tools/device/ahead_check.py $A3B --tokens 64
for round in 1 2; do
  part plain_$round 30 env STRATA_DECODE_AHEAD=0 $A3B_RESIDENT
  part ahead_$round 30 $A3B_RESIDENT
done
part plain_int8 30 env STRATA_DECODE_AHEAD=0 $A3B_RESIDENT --kv-dtype int8
part ahead_int8 30 $A3B_RESIDENT --kv-dtype int8
finish 14
