#!/usr/bin/env bash
# Session 13's third call (one H200, ~8 minutes: timeout_s 560; carry .whl and .devcache). Issue 6 after ce1057e
# (lent slots refilled by one gather kernel a layer): while the full file is made, the prompt experts' parity table
# at 2K / 8K / 16K (all three paths) and the half-tile sweep in the reverse order of call 2's (its first shape is
# timed cold); then, after `sync` (the new file's write-back out of the way), issue 6's command in a first process
# and a 4K prompt layer by layer in a second (the time after the last layer's launch: the refill and checkpoint).
set -uo pipefail
BUDGET=${BUDGET:-520}
source tools/device/parts.sh || exit 1
make_full_bg; F=$FULL
part moe_table 80 python3 -m strata bench moe-prefill --only "Q2_0 / Q2_0" --tokens 2048,8192,16384
S="128x32x4x3hr/64x4x3hr,128x32x4x3h/64x4x3h,128x32x4x3hr/64x4x3hr,128x32x4x3h/64x4x3h"
part fused_sweep 60 python3 -m strata bench moe-prefill --only "Q2_0 / Q2_0" --tokens 16384 --paths fused --reps 10 \
  --sweep "$S"
wait_file $FULL_MADE 260
t0=$SECONDS; sync; echo "sync $((SECONDS - t0))s" | tee -a $L/times.txt
part prompt_first 100 python3 -m strata bench prompt $F --device cuda --vram-budget 12 --ctx 4096,32768 \
  --routing balanced --reps 2
part probe_4k 70 python3 tools/device/chunk_probe.py $F --tokens 4096 --vram-budget 12 --forms dma --per-layer --seed 11
finish 40
