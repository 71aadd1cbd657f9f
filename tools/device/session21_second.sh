#!/usr/bin/env bash
# Session 21's second call (one H200, ~8 minutes: timeout_s 560; carry .whl, .ab and .devcache). Issue 4, after the
# first call (unmasked loads: the same bytes, 1.73 ms against 1.72: ptxas spread the activation loads between the
# products; the down kernel in 3 groups of 64 lanes: 1.90, each group's loads after the previous group's dots).
# Arms alternating (A3B all resident, fp16 KV):
#   base     .ab/base (5f7e641: session 20's last code)
#   hold     .ab/hold (HEAD, the down kernel in one group: unit_parts off): unmasked loads kept together by a CTA
#            barrier after them and volatile activation loads; the dense matvec's row weight loaded beside x
#   parts16  .ab/parts16 (HEAD: + the down kernel in 3 groups, every group's loads first; 8 rows x 16 warps)
#   parts8   .ab/parts8 (the same at 8 warps)
# Make the arms: rm -rf .ab && mkdir -p .ab/{base,hold,parts16,parts8} && git archive 5f7e641 strata ':!strata/data'
#   | tar -x -C .ab/base && for a in hold parts16 parts8; do git archive HEAD strata tools ':!strata/data' | tar -x
#   -C .ab/$a; done && cp -r tools .ab/base/ && sed -i 's/total \/\/ nu == 3 and/False and/' 
#   .ab/hold/strata/kernels/moe/oneshot_gemv.py && sed -i 's/("down", "Q4_0"): dict(oneshot=True, bn=8, warps=16/
#   ("down", "Q4_0"): dict(oneshot=True, bn=8, warps=8/' .ab/parts8/strata/kernels/moe/gemv.py
# Then the one-shot kernels' CUDA tests, greedy tokens of hold and parts16 against base, each arm's increments.
set -uo pipefail
BUDGET=${BUDGET:-520}
source tools/device/parts.sh || exit 1
make_a3b_bg && BUDGET=$((BUDGET + 30))
part tests_oneshot 90 python3 -m pytest -q -p no:cacheprovider tests/kernels/moe/test_oneshot_gemv.py
wait_file $A3B 200
ab_rounds 2 30 "base hold parts16 parts8" $A3B_RESIDENT
arms_tokens base "hold parts16"
for arm in base hold parts16; do
  part inc_$arm 40 python3 .ab/$arm/tools/device/profile_decode.py $A3B --steps 8 --vram-budget 24 --increments
done
finish 12
