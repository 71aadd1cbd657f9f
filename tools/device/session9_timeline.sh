#!/usr/bin/env bash
# Session 9: the streamed prompt's timeline where the ring holds two layers (issue 6 end to end): 12 full-size
# layers at budgets that leave the cache 2,048+ slots (the 48-layer file at 12 GiB has 3,409, a two-layer ring).
set -uo pipefail
BUDGET=${BUDGET:-200}
source tools/device/parts.sh || exit 1
make_q4x12
P="python3 tools/device/profile_prompt.py $M/q4x12-00001-of-00002.gguf --routing balanced --rows 6 --timeline"
part timeline_b7 80 $P --tokens 4096 --vram-budget 7

finish 30
