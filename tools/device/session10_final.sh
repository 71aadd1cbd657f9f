#!/usr/bin/env bash
# Session 10's last call: the streamed prompt with this session's defaults (gather on 66 programs, the next layer
# queued early) at 4K and 32K, against STRATA_PF_EARLY=0 and the copy engines (STRATA_PF_STREAM=dma), one run.
set -uo pipefail
BUDGET=${BUDGET:-250}
source tools/device/parts.sh || exit 1
L=$OUT
make_q4x12
B="python3 -m strata bench prompt $M/q4x12-00001-of-00002.gguf --device cuda --vram-budget 7 --ctx 4096,32768 --routing balanced --reps 3"
part prompt_warmup 40 python3 -m strata bench prompt $M/q4x12-00001-of-00002.gguf --device cuda --vram-budget 7 --ctx 4096 --routing balanced --reps 1
part prompt_default 60 $B
STRATA_PF_EARLY=0 part prompt_late 60 $B
STRATA_PF_STREAM=dma part prompt_dma 50 $B
finish 10
