#!/usr/bin/env bash
# Session 13's second call (one H200, ~7 minutes: timeout_s 560; carry .whl and .devcache). Issue 6:
# (1) the fused Q2_0 kernels' half tiles ("r": a 128-row tile whose rows past 64 are padding computes 64; 17 % of
# the skewed layer's rows at 16K are padding on 128-row tiles, 10.5 % with it) against the default shape, timed in
# one process while the full file is made; (2) issue 6's command in a first and a second process after ce1057e
# (a prompt's lent slots refilled by one gather kernel a layer: 67 ms of host time in copy calls before).
set -uo pipefail
BUDGET=${BUDGET:-520}
source tools/device/parts.sh || exit 1
make_full_bg; F=$FULL
S="128x32x4x3h/64x4x3h,128x32x4x3hr/64x4x3hr,128x32x4x3hr/64x4x3h,128x32x4x3h/64x4x3hr,32x4x3h/64x4x3h,32x4x3hr/64x4x3hr"
part fused_sweep 150 python3 -m strata bench moe-prefill --only "Q2_0 / Q2_0" --tokens 16384,2048 --paths fused \
  --reps 10 --sweep "$S"
wait_file $FULL_MADE 260
P="python3 -m strata bench prompt $F --device cuda --vram-budget 12 --ctx 4096,32768 --routing balanced --reps 2"
part prompt_first 100 $P
part prompt_second 100 $P
finish 40
