#!/usr/bin/env bash
# Ready for session 14's first call (one H200, ~8 minutes: timeout_s 560; carry .whl and .devcache). Issue 6:
# (1) the fused prompt experts' last 5-10 % to 2.5x the int8 floor at 16K: the down rows stored as fp16 for the
# combine ("o", 2be376d: 0.84 GB written and read back instead of 1.68) and with the half tiles ("r"), each shape
# twice in one process (the first shape of a list is timed cold; repeats moved +-5 % in session 13), while the full
# file is made; (2) issue 6's command in a first and a second process (session 13: 1.45-1.54x / 1.30-1.35x at 4K).
set -uo pipefail
BUDGET=${BUDGET:-520}
source tools/device/parts.sh || exit 1
make_full_bg; F=$FULL
S="128x32x4x3h/64x4x3h,128x32x4x3h/64x4x3ho,128x32x4x3hr/64x4x3hro,128x32x4x3h/64x4x3h,128x32x4x3h/64x4x3ho"
S="$S,128x32x4x3hr/64x4x3hro"
part fused_sweep 100 python3 -m strata bench moe-prefill --only "Q2_0 / Q2_0" --tokens 16384,8192 --paths fused \
  --reps 10 --sweep "$S"
part moe_table 60 python3 -m strata bench moe-prefill --only "Q2_0 / Q2_0" --tokens 16384 --paths mmq,fused
wait_file $FULL_MADE 260
t0=$SECONDS; sync; echo "sync $((SECONDS - t0))s" | tee -a $L/times.txt
P="python3 -m strata bench prompt $F --device cuda --vram-budget 12 --ctx 4096,32768 --routing balanced --reps 2"
part prompt_first 100 $P
part prompt_second 100 $P
finish 40
