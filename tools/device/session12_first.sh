#!/usr/bin/env bash
# Ready for session 12's first call (one H200, ~9 minutes: run with timeout_s 590; carry .whl and .devcache; a
# bench process takes ~30 s to free its pinned store at exit, inside its cap):
# - issue 6: does MADV_RANDOM on the n-gram table (gguf/access_advice.py) take the cold-page waits out of the
#   streamed prompt? Issue 6's command by dma (the default) and by gather, each now printing how long the forwards
#   waited for the n-gram rows; then chunk_probe.py's 32K chunk by chunk (its n-gram wait a chunk beside).
#   Session 11 saw whichever process ran first after the file was made run slower (dma 4.75x at 32K in one call).
# - issue 4: the chained decode's tile sweep at the A3B shape (`bench moe-chain --sweep`; session 11's crash, the
#   counters' device key, is mended), while the full-size file is made (~200 s).
set -uo pipefail
BUDGET=${BUDGET:-520}
source tools/device/parts.sh || exit 1
make_full_bg; F=$FULL
part chain_sweep 120 python3 -m strata bench moe-chain --shapes a3b-q4_0 --sweep
wait_file $FULL_MADE 260
P="python3 -m strata bench prompt $F --device cuda --vram-budget 12 --ctx 4096,32768 --routing balanced --reps 2"
part prompt_dma 100 $P
STRATA_PF_STREAM=gather part prompt_gather 100 $P
part chunk_32k 110 python3 tools/device/chunk_probe.py $F --tokens 32768 --vram-budget 12 --forms dma,gather
finish 30
