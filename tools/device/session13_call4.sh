#!/usr/bin/env bash
# Session 13's fourth call (one H200, ~7.5 minutes: timeout_s 520; carry .whl and .devcache). Issue 6 after 39d5cab:
# the checkpoint's host slabs pinned in the routing waits during a streamed prompt (STRATA_CHECKPOINT_AHEAD, on by
# default) instead of after the last layer. Issue 6's command in a first process with it (the slowest place) and in
# a second without it (STRATA_CHECKPOINT_AHEAD=0): if the first is the faster, the change outweighs the order.
set -uo pipefail
BUDGET=${BUDGET:-470}
source tools/device/parts.sh || exit 1
make_full_bg; F=$FULL
wait_file $FULL_MADE 260
t0=$SECONDS; sync; echo "sync $((SECONDS - t0))s" | tee -a $L/times.txt
P="python3 -m strata bench prompt $F --device cuda --vram-budget 12 --ctx 4096,32768 --routing balanced --reps 2"
part prompt_ahead 100 $P
STRATA_CHECKPOINT_AHEAD=0 part prompt_after 100 $P
finish 40
