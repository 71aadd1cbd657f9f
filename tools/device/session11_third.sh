#!/usr/bin/env bash
# Session 11's third call (one H200, ~8 minutes; carry .whl and .devcache):
# - issue 4: dp4awire.sh (nested): A3B decode all resident, unset against STRATA_DP4A=1, and the greedy check (the
#   full-size qwen4exp is made in the background meanwhile, niced: the decode figures share the host with it);
# - issue 6: chunk_probe.py after what `bench prompt` does first (ceilings, three 4K prompts): a 32K prompt chunk by
#   chunk by dma, then by gather (the second call found 32K by dma at 1.36x the PCIe floor in a fresh process, where
#   bench prompt had 4.75x).
set -uo pipefail
BUDGET=${BUDGET:-500}
source tools/device/parts.sh || exit 1
make_full_bg; F=$FULL
script dp4awire 330
wait_file $FULL_MADE 300
part chunk_seq 160 python3 tools/device/chunk_probe.py $F --tokens 32768 --vram-budget 12 --forms dma,gather \
  --before 4096x3
finish 40
