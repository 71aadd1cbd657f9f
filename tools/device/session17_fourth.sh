#!/usr/bin/env bash
# Session 17's fourth call (one H200, ~5 minutes: timeout_s 400; carry .whl, .ab and .devcache). Issue 4: the A3B
# step over an int8 KV cache, A against B: .ab/io (this commit: the static view's cells in order, not loaded from its
# ids) against .ab/h8 (the same package with static_kv.py before it); where the int8 step spends its time after.
# Make the arms first:
#   rm -rf .ab && for a in io h8; do mkdir -p .ab/$a && git archive HEAD strata ':!strata/data' | tar -x -C .ab/$a; done
#   git show HEAD~1:strata/engine/static_kv.py > .ab/h8/strata/engine/static_kv.py
set -uo pipefail
BUDGET=${BUDGET:-300}
source tools/device/parts.sh || exit 1
make_a3b_bg && BUDGET=$((BUDGET + 60))
part tests 100 python3 -m pytest -q -p no:cacheprovider -x tests/kernels/attention/test_decode_short.py \
  tests/engine/test_decode_fused_store.py
wait_file $A3B 240
ab_rounds 2 35 "io h8" $A3B_RESIDENT --kv-dtype int8
part inc_int8 45 python3 tools/device/profile_decode.py $A3B --steps 8 --vram-budget 24 --increments --kv-dtype int8
finish 14
