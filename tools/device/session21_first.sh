#!/usr/bin/env bash
# Session 21's first call (one H200, ~9 minutes: timeout_s 590; carry .whl, .ab and .devcache). Issue 4: the float
# one-shot matvecs' instructions. Arms alternating (A3B all resident, fp16 KV):
#   base     .ab/base (5f7e641: session 20's last code)
#   mask     .ab/mask (efb362c: loads without masks where every lane is valid; gate/up 1,742 -> 1,582 instructions)
#   parts16  .ab/parts16 (the working tree: + the routed down in 3 groups of 64 unit lanes, its tile 8 rows x 16 warps)
#   parts8   .ab/parts8 (the same, the down tile at 8 warps: 6.8 instructions a weight against 8.4)
#   gu80     .ab/gu80 (parts16 + the experts' gate/up built at maxnreg=80: one wave of 768 programs, 40 B spilled)
# Make the arms: rm -rf .ab && mkdir -p .ab/{base,mask,parts16,parts8,gu80} && for a in base:5f7e641 mask:efb362c;
#   do git archive ${a#*:} strata ':!strata/data' | tar -x -C .ab/${a%:*}; done && for a in parts16 parts8 gu80; do
#   git ls-files -co --exclude-standard strata | grep -v ^strata/data | tar -cf - -T - | tar -xf - -C .ab/$a; done,
#   then parts8's MEASURED_TILES down Q4_0 warps=8 and gu80's gate/up launch with maxnreg=80 (sed, see below).
# Then the one-shot kernels' CUDA tests, greedy tokens of base / mask / parts16 compared, parts16's increments.
set -uo pipefail
BUDGET=${BUDGET:-540}
source tools/device/parts.sh || exit 1
make_a3b_bg && BUDGET=$((BUDGET + 30))
part tests_oneshot 90 python3 -m pytest -q -p no:cacheprovider tests/kernels/moe/test_oneshot_gemv.py
wait_file $A3B 200
ab_rounds 2 30 "base mask parts16 parts8 gu80" $A3B_RESIDENT
arms_tokens base "mask parts16"
part inc_parts16 40 python3 tools/device/profile_decode.py $A3B --steps 8 --vram-budget 24 --increments
finish 12
