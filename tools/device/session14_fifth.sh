#!/usr/bin/env bash
# Session 14's fifth call (one H200, ~7 minutes: timeout_s 480; carry .whl and .devcache). Issue 6 end to end after
# the fused Q2_0 default became "128x64x8x3hr/128x8x3hro": issue 6's command in a first process (the first call:
# 1.36x / 1.26x the PCIe floor at 4K / 32K; sessions 12-13: 1.45-1.54x at 4K), then in a second process with
# STRATA_PF_FUSED=1 (the fused prompt experts inside the engine, their work buffers in borrowed cache slots).
set -uo pipefail
BUDGET=${BUDGET:-450}
source tools/device/parts.sh || exit 1
make_full_bg; F=$FULL
wait_file $FULL_MADE 260
t0=$SECONDS; sync; echo "sync $((SECONDS - t0))s" | tee -a $L/times.txt
P="python3 -m strata bench prompt $F --device cuda --vram-budget 12 --ctx 4096,32768 --routing balanced --reps 2"
part prompt_first 100 $P
STRATA_PF_FUSED=1 part prompt_fused 100 $P
finish 40
