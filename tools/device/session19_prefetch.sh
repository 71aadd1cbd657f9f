#!/usr/bin/env bash
# Session 19's third call (one H200, ~5 minutes: timeout_s 400; carry .whl and .devcache). Issue 4. Call 2 found the
# routed expert kernels slow because each load waits for the routing (the same dp4a kernel ran 6.65 us on one dense
# operand, 9.44 routed). STRATA_L2_PREFETCH (new) uses that wait: the experts' gate/up programs, launched early
# under PDL, ask the L2 for the next layer's q/k/v and o weights before their wait. Arms (three rounds): default
# against STRATA_L2_PREFETCH=1, then int8 KV both ways and the prefetch arm's increments.
set -uo pipefail
BUDGET=${BUDGET:-300}
source tools/device/parts.sh || exit 1
make_a3b_bg && BUDGET=$((BUDGET + 60))
wait_file $A3B 240
for round in 1 2 3; do
  part default_$round 30 $A3B_RESIDENT
  part prefetch_$round 30 env STRATA_L2_PREFETCH=1 $A3B_RESIDENT
done
part default_int8 30 $A3B_RESIDENT --kv-dtype int8
part prefetch_int8 30 env STRATA_L2_PREFETCH=1 $A3B_RESIDENT --kv-dtype int8
part inc_prefetch 40 env STRATA_L2_PREFETCH=1 python3 tools/device/profile_decode.py $A3B --steps 8 --vram-budget 24 \
  --increments
finish 12
