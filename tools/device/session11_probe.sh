#!/usr/bin/env bash
# Session 11's second call (one H200, ~8 minutes; carry .whl and .devcache):
# - issue 4: the dp4a GEMV prototype's tests on CUDA and its sweep (dp4a.sh, nested), while the full-size qwen4exp
#   is made in the background (~200 s);
# - issue 6: the full file at 12 GiB read 32K by the copy engines at 4.75x the PCIe floor, 4K at 1.69x (the first
#   call): chunk_probe.py times each chunk of a 32K prompt by dma and by gather, then profiles two chunks by dma.
set -uo pipefail
BUDGET=${BUDGET:-470}
source tools/device/parts.sh || exit 1
Q=/tmp/q4x; mkdir -p $Q
F=$Q/full-00001-of-00002.gguf
(nice -n 5 python3 -m strata make-model --arch qwen4exp --preset full -o $Q/full.gguf > $L/make_full.log 2>&1 \
  && touch $Q/made) &
script dp4a 200
while [ ! -f $Q/made ] && [ $SECONDS -lt 280 ]; do sleep 2; done
part chunk_probe 200 python3 tools/device/chunk_probe.py $F --tokens 32768 --vram-budget 12 --forms dma,gather
finish 40
