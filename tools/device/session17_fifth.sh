#!/usr/bin/env bash
# Session 17's fifth call (one H200, ~4 minutes: timeout_s 360; carry .whl, .ab and .devcache). Issue 4: the A3B
# step over an int8 KV cache, A against B: .ab/m (this commit: int8 codes to fp16 by the exponent trick, no I2F)
# against .ab/io (decode_short.py before it); the int8 step's increments after; the attention kernel alone.
# Make the arms first:
#   rm -rf .ab && for a in m io; do mkdir -p .ab/$a && git archive HEAD strata ':!strata/data' | tar -x -C .ab/$a; done
#   git show HEAD~1:strata/kernels/attention/decode_short.py > .ab/io/strata/kernels/attention/decode_short.py
set -uo pipefail
BUDGET=${BUDGET:-280}
source tools/device/parts.sh || exit 1
make_a3b_bg && BUDGET=$((BUDGET + 60))
part tests 80 python3 -m pytest -q -p no:cacheprovider -x tests/kernels/attention/test_decode_short.py
part attn8 40 python3 -m strata bench decode-attn --spans 256,2048 --kv int8
wait_file $A3B 240
ab_rounds 2 35 "m io" $A3B_RESIDENT --kv-dtype int8
part inc_int8 45 python3 tools/device/profile_decode.py $A3B --steps 8 --vram-budget 24 --increments --kv-dtype int8
finish 14
