#!/usr/bin/env bash
# Session 11's last call (one H200, ~8 minutes; carry .whl and .devcache): issue 6's command on the full-size
# qwen4exp (made first, ~200 s) by the gather kernel (the default for that call; dma is the default again since),
# then by the copy engines, then a 4K prompt's per-layer split by gather on 66 (the default), 33 and 99 programs and by
# dma (chunk_probe.py).
set -uo pipefail
BUDGET=${BUDGET:-460}
source tools/device/parts.sh || exit 1
Q=/tmp/q4x; mkdir -p $Q
F=$Q/full-00001-of-00002.gguf
part make_full 230 python3 -m strata make-model --arch qwen4exp --preset full -o $Q/full.gguf
P="python3 -m strata bench prompt $F --device cuda --vram-budget 12 --ctx 4096,32768 --routing balanced --reps 2"
STRATA_PF_STREAM=gather part prompt_full 80 $P
STRATA_PF_STREAM=dma part prompt_full_dma 85 $P
part chunk_4k 60 python3 tools/device/chunk_probe.py $F --tokens 4096 --vram-budget 12 \
  --forms gather,gather@p33,gather@p99,dma
finish 30
