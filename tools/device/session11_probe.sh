#!/usr/bin/env bash
# Session 11's second call (one H200, ~8 minutes; carry .whl and .devcache):
# - issue 4: the dp4a GEMV prototype's tests on CUDA and its sweep (dp4a.sh, nested), while the full-size qwen4exp
#   is made in the background (~200 s);
# - issue 6: the full file at 12 GiB read 32K by the copy engines at 4.75x the PCIe floor, 4K at 1.69x (the first
#   call): chunk_probe.py times each chunk of a 32K prompt by dma and by gather, then profiles two chunks by dma.
set -uo pipefail
BUDGET=${BUDGET:-470}
source tools/device/parts.sh || exit 1
make_full_bg; F=$FULL
script dp4a 200
wait_file $FULL_MADE 280
part chunk_probe 200 python3 tools/device/chunk_probe.py $F --tokens 32768 --vram-budget 12 --forms dma,gather
finish 40
