#!/usr/bin/env bash
# Session 10: the streamed prompt's events in time order, default and STRATA_PF_EARLY (issue 6 end to end).
set -uo pipefail
BUDGET=${BUDGET:-240}
source tools/device/parts.sh || exit 1
L=$OUT
make_q4x12
S="python3 tools/device/stream_split.py $M/q4x12-00001-of-00002.gguf --tokens 4096 --vram-budget 7 --reps 0"
part dump_early 70 $S --dump early
[ "${LATE:-0}" = 1 ] && part dump_late 70 $S --dump late
finish 5
