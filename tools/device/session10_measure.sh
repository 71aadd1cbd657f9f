#!/usr/bin/env bash
# Session 10's measuring call: the streamed prompt with the gather on 66 programs (the new default) against 132 (the
# old) and with STRATA_PF_EARLY, in one run; then the bulk L2 prefetch probe (issue 4), last (a first call with it
# lost the machine).
set -uo pipefail
BUDGET=${BUDGET:-300}
source tools/device/parts.sh || exit 1
L=$OUT
make_q4x12
B="python3 -m strata bench prompt $M/q4x12-00001-of-00002.gguf --device cuda --vram-budget 7 --ctx 4096,16384 --routing balanced --reps 2"
part prompt_p66 60 $B
STRATA_PF_GATHER=p132b2048w4 part prompt_p132 60 $B
STRATA_PF_EARLY=1 part prompt_p66_early 60 $B
part l2_probe 50 python3 tools/device/l2_prefetch_probe.py --mb 4.7,14
finish 14
