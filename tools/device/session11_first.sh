#!/usr/bin/env bash
# Ready for session 11's first call (one H200, ~8 minutes; carry .whl and .devcache):
# - issue 6's command on the full-size qwen4exp with session 10's defaults (copy engines, next layer queued early):
#   `bench prompt --vram-budget 12 --ctx 4096,32768 --routing balanced`, then the same with STRATA_PF_STREAM=gather;
# - where a 4K streamed prompt's passes still lose time (12 layers at 7 GiB: stream_split's split and --dump);
# - issue 4: the chained decode's tile sweep at the A3B shape (`bench moe-chain --sweep`, never run) and the A3B
#   decode all resident.
# The full file (~200 s) and the A3B file (~90 s) are made in the background at the start.
set -uo pipefail
BUDGET=${BUDGET:-480}
source tools/device/parts.sh || exit 1
L=$OUT
make_full_bg; F=$FULL A=$M/a3b.gguf
make_a3b_bg
make_q4x12
part split_4k 90 python3 tools/device/stream_split.py $M/q4x12-00001-of-00002.gguf --tokens 4096 --vram-budget 7 \
  --reps 2 --dump early
wait_file $A 200
part chain_sweep 80 python3 -m strata bench moe-chain --shapes a3b-q4_0 --sweep
wait_file $FULL_MADE 300
P="python3 -m strata bench prompt $F --device cuda --vram-budget 12 --ctx 4096,32768 --routing balanced --reps 2"
part prompt_full 110 $P
STRATA_PF_STREAM=gather part prompt_full_gather 90 $P
finish 24
