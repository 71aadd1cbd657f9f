#!/usr/bin/env bash
# Session 17's second call (one H200, ~7 minutes: timeout_s 480; carry .whl, .ab and .devcache). Issue 4: the
# decode attention's native dots over int8 codes (45e4a9a), alone (`bench decode-attn --kv int8 --sweep`), in greedy
# tokens against split-K, and in the A3B step over an int8 KV cache A against B: .ab/head (45e4a9a's package),
# .ab/n32 (the same, chunks of 32), .ab/tf (decode_short.py of 45e4a9a~1: tf32x3 over codes scaled in fp32); then
# over the fp16 default, .ab/r4 (the routing launch at 4 warps) against head.
# Make the arms first:
#   rm -rf .ab && for a in head n32 tf r4; do mkdir -p .ab/$a && git archive HEAD strata ':!strata/data' | tar -x -C .ab/$a; done
#   sed -i 's/^    chunk: int = 0  #/    chunk: int = 32  #/' .ab/n32/strata/kernels/attention/decode_short.py
#   git show 45e4a9a~1:strata/kernels/attention/decode_short.py > .ab/tf/strata/kernels/attention/decode_short.py
#   sed -i 's/^    warps: int = 0  #/    warps: int = 4  #/' .ab/r4/strata/kernels/pointwise/add_norm_route.py
set -uo pipefail
BUDGET=${BUDGET:-400}
source tools/device/parts.sh || exit 1
make_a3b_bg && BUDGET=$((BUDGET + 60))
part tests 100 python3 -m pytest -q -p no:cacheprovider tests/kernels/attention/test_decode_short.py
part attn8 90 python3 -m strata bench decode-attn --spans 256,2048 --kv int8 --sweep --sweep-spans 256,2048
wait_file $A3B 240
part tokens8 100 python3 tools/device/attn_tokens_check.py $A3B --kv-dtype int8 --only attn --tokens 24 --prompts 300,900
ab_rounds 2 35 "head n32 tf" $A3B_RESIDENT --kv-dtype int8
ab_rounds 2 35 "head r4" $A3B_RESIDENT
finish 10
