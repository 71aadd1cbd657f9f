#!/usr/bin/env bash
# Session 17's sixth call (one H200, ~5.5 minutes: timeout_s 380; carry .whl, .ab and .devcache). Issue 4: the
# routing launch (add + norm + router + top-8) at one warp a program, where its reductions need no barriers (63 -> 2
# in the sm_90 build): alone (`bench decode-attn`'s route sweep), then in the A3B step A against B: .ab/head (this
# commit), .ab/w21 (2 experts a program, 1 warp), .ab/w11 (1 expert a program, 1 warp); greedy tokens of w21
# against the three separate launches; the int8 step at this commit.
# Make the arms first (each with the tokens tool, which imports the package beside it):
#   rm -rf .ab && for a in head w21 w11; do mkdir -p .ab/$a/tools/device && git archive HEAD strata ':!strata/data' \
#     | tar -x -C .ab/$a && cp tools/device/attn_tokens_check.py .ab/$a/tools/device/; done
#   R='num_warps=config.warps or min(4, max(1, block \/\/ 256))'
#   sed -i "s/^    experts_per_program: int = 4 /    experts_per_program: int = 2 /; s/$R/num_warps=config.warps or 1/" \
#     .ab/w21/strata/kernels/pointwise/add_norm_route.py   (and = 1 for .ab/w11)
set -uo pipefail
BUDGET=${BUDGET:-300}
source tools/device/parts.sh || exit 1
make_a3b_bg && BUDGET=$((BUDGET + 60))
part route 45 python3 -m strata bench decode-attn --spans 256 --sweep --sweep-spans 1
part tests 40 python3 -m pytest -q -p no:cacheprovider tests/kernels/pointwise/test_add_norm_route.py
wait_file $A3B 240
ab_rounds 2 30 "head w21 w11" $A3B_RESIDENT
part int8 30 $A3B_RESIDENT --kv-dtype int8
part tokens 50 env -C .ab/w21 python3 tools/device/attn_tokens_check.py $A3B --only route --tokens 24 --prompts 300
finish 12
