#!/usr/bin/env bash
# Ready for session 18's first call (one H200, ~6 minutes: timeout_s 420; carry .whl, .ab and .devcache). Issue 4,
# after session 17 (the routing launch at one warp, 1.77 ms; the int8 cache's native dots, 2.02 ms):
#  1. the default step and STRATA_DP4A + STRATA_DP4A_SPLIT beside it, two rounds each (their routing launch, with the
#     int8 codes of the normed row, now at one warp too: no longer slower than the default?);
#  2. where the default step spends its time now (profile_decode.py --increments);
#  3. the int8 cache at a 1,200-token prompt (span 2048, 16 programs a KV head) A against B: .ab/head against
#     .ab/tf (decode_short.py of 45e4a9a~1: tf32x3 over codes scaled in fp32);
#  4. the tiny qwen4exp's captured decode (int8 KV, QSA; D 256: the native dots in chunks of 32) against step by step.
# Make the arms first:
#   rm -rf .ab && for a in head tf; do mkdir -p .ab/$a && git archive HEAD strata ':!strata/data' | tar -x -C .ab/$a; done
#   git show 45e4a9a~1:strata/kernels/attention/decode_short.py > .ab/tf/strata/kernels/attention/decode_short.py
set -uo pipefail
BUDGET=${BUDGET:-330}
source tools/device/parts.sh || exit 1
make_a3b_bg && BUDGET=$((BUDGET + 60))
Q=$(mktemp -d /tmp/s18-q4.XXXX)
part graphs_qwen4exp 60 python3 tools/device/qwen4exp_check.py $Q graphs
wait_file $A3B 240
for round in 1 2; do
  part default_$round 30 $A3B_RESIDENT
  part split_$round 30 env STRATA_DP4A=1 STRATA_DP4A_SPLIT=1 $A3B_RESIDENT
done
part inc_default 40 python3 tools/device/profile_decode.py $A3B --steps 8 --vram-budget 24 --increments
ab_rounds 2 30 "head tf" $A3B_RESIDENT --kv-dtype int8 --prompt-tokens 1200
finish 14
