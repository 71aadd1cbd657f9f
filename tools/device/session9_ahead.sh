#!/usr/bin/env bash
# Session 9: the streamed prompt copying two layers ahead against one (STRATA_PF_AHEAD=1), 12 full-size layers at
# 7 GiB (a two-layer ring, as the 48-layer file at 12 GiB), balanced routing; the timeline of the new form.
set -uo pipefail
BUDGET=${BUDGET:-260}
source tools/device/parts.sh || exit 1
make_q4x12
Q=$M/q4x12-00001-of-00002.gguf
B="python3 -m strata bench prompt $Q --vram-budget 7 --ctx 4096,16384 --routing balanced"
part ahead2 70 $B
STRATA_PF_AHEAD=1 part ahead1 70 $B
part timeline2 60 python3 tools/device/profile_prompt.py $Q --routing balanced --rows 4 --timeline --tokens 4096 --vram-budget 7
finish 14
