#!/usr/bin/env bash
# Session 17's third call (one H200, ~6 minutes: timeout_s 420; carry .whl, .ab and .devcache). Issue 4: the A3B
# step over an int8 KV cache with the native dots (the second call's int8 `head` log was overwritten by its fp16
# arms of the same name), A against B: .ab/h8 (this commit's package) against .ab/s1 (the decode attention at 1
# stage: 6.42 against 6.72 us alone at span 256); the fp16 default with the routing at 4 warps; where the int8 and the
# fp16 steps spend their time (profile_decode.py --increments); the CUDA tests of the routing launch.
# Make the arms first:
#   rm -rf .ab && for a in h8 s1; do mkdir -p .ab/$a && git archive HEAD strata ':!strata/data' | tar -x -C .ab/$a; done
#   sed -i 's/^    stages: int = 2$/    stages: int = 1/' .ab/s1/strata/kernels/attention/decode_short.py
set -uo pipefail
BUDGET=${BUDGET:-360}
source tools/device/parts.sh || exit 1
make_a3b_bg && BUDGET=$((BUDGET + 60))
part tests 80 python3 -m pytest -q -p no:cacheprovider tests/kernels/pointwise/test_add_norm_route.py \
  tests/kernels/attention/test_decode_short.py
wait_file $A3B 240
ab_rounds 2 35 "h8 s1" $A3B_RESIDENT --kv-dtype int8
part fp16 35 $A3B_RESIDENT
P="python3 tools/device/profile_decode.py $A3B --steps 8 --vram-budget 24 --increments"
part inc_int8 45 $P --kv-dtype int8
part inc_fp16 45 $P
finish 40
