#!/usr/bin/env bash
# Session 21's fourth call (one H200, ~8 minutes: timeout_s 500; carry .whl and .devcache). Issue 4 on the headline
# model for the first time since session 8 (79.3 tok/s at 12 GiB then): the full-size qwen4exp (Strata's 125B shape,
# Q2_0 experts, made here ~200 s) with issue 4's command at 12 GiB, then at 24 GiB if time is left.
set -uo pipefail
BUDGET=${BUDGET:-470}
source tools/device/parts.sh || exit 1
make_full_bg
wait_file $FULL_MADE 300
part full_12 150 python3 -m strata bench decode $FULL --device cuda --vram-budget 12 --ctx 4096 --prompt-tokens 32 --tokens 64
part full_24 120 python3 -m strata bench decode $FULL --device cuda --vram-budget 24 --ctx 4096 --prompt-tokens 32 --tokens 64
finish 30
