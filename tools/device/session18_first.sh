#!/usr/bin/env bash
# Ready for session 18's first call (one H200, ~7 minutes: timeout_s 480; carry .whl, .ab and .devcache). Issue 4,
# after session 17 (the routing launch at one warp, 1.77 ms; the int8 cache's native dots, 2.02 ms):
#  1. the default step and STRATA_DP4A + STRATA_DP4A_SPLIT beside it (their routing launch, with the int8 codes of
#     the normed row, now at one warp too), and the switches' step with o's matvec left in float (.ab/of: no
#     `quantize_x` launch a layer; by session 15's increments quantize_x 1.93 + split o ~2.7 us against float o's
#     3.5), rounds alternating;
#  2. where the default step spends its time now (profile_decode.py --increments);
#  3. the int8 cache at a 1,200-token prompt (span 2048, 16 programs a KV head) A against B: .ab/head against
#     .ab/tf (the int8 cache's dots tf32x3 over codes scaled in fp32, as before 45e4a9a);
#  4. the tiny qwen4exp's captured decode (int8 KV, QSA; D 256: the native dots in chunks of 32) against step by step.
# Make the arms first:
#   rm -rf .ab && for a in head tf of; do mkdir -p .ab/$a && git archive HEAD strata ':!strata/data' | tar -x -C .ab/$a; done
#   sed -i 's/cache_dtype in (torch.float16, torch.int8)/cache_dtype in (torch.float16,)/' \
#     .ab/tf/strata/kernels/attention/decode_short.py
#   sed -i 's/out = dp4a_step.matvec(heads, self.attention\[i\].o) if self.dp4a_wired else None/out = None/' \
#     .ab/of/strata/models/decoder.py
set -uo pipefail
BUDGET=${BUDGET:-380}
source tools/device/parts.sh || exit 1
make_a3b_bg && BUDGET=$((BUDGET + 60))
Q=$(mktemp -d /tmp/s18-q4.XXXX)
part graphs_qwen4exp 60 python3 tools/device/qwen4exp_check.py $Q graphs
wait_file $A3B 240
SPLIT="env STRATA_DP4A=1 STRATA_DP4A_SPLIT=1"
for round in 1 2; do
  part default_$round 30 env -C .ab/head $A3B_RESIDENT
  part split_$round 30 env -C .ab/head $SPLIT $A3B_RESIDENT
  part split_of_$round 30 env -C .ab/of $SPLIT $A3B_RESIDENT
done
part inc_default 40 python3 tools/device/profile_decode.py $A3B --steps 8 --vram-budget 24 --increments
ab_rounds 2 30 "head tf" $A3B_RESIDENT --kv-dtype int8 --prompt-tokens 1200
finish 14
