#!/usr/bin/env bash
# Session 7's first call, two H200s (nvidia-h200-x2); carry .whl and .devcache.
# Card 0: issue 10's verify windows on the GPU (tools/device/specexact.sh: branch specexact2's exact cases, never yet
#   run on a GPU; every exact case should print N/N bit-equal rows, yes/yes/yes and ALL OK).
# Card 1: issue 5's imma configs with scales copied ahead (e1/e2, never timed) at the five default shapes; issue 6's
#   parity tool for the int8 rate measured with a column-major B (the old floor used 112 TOPS); then the full-size
#   qwen4exp at a 24 GiB budget (never run) and its prompt at 4,096 and 32,768 tokens behind 12 GiB.
set -uo pipefail
BUDGET=${BUDGET:-560}
source tools/device/parts.sh || exit 1
Q=/tmp/q4x; mkdir -p $Q
(export CUDA_VISIBLE_DEVICES=0
 script specexact 470) &
(export CUDA_VISIBLE_DEVICES=1
 (nice -n 5 python3 -m strata make-model --arch qwen4exp --preset full -o $Q/full.gguf > $L/make_full.log 2>&1 \
   && touch $Q/made) &
 part imma_shapes 80 python3 -m strata.bench.prompt_attn --variants imma --no-sdpa --reps 3 \
   --sweep t2p16r128x1g1 t2p16r128x1g1e1 t2p16r128x1g1e2 t2p16r128x1g1d2e1 t2p16r128x1g1d2e2 t2p16r128x1g1d2
 part moe_prefill 70 python3 -m strata bench moe-prefill --only "Q2_0 / Q2_0" --tokens 2048,16384
 while [ ! -f $Q/made ] && [ $SECONDS -lt 300 ]; do sleep 2; done
 F=$Q/full-00001-of-00002.gguf
 part full24 150 python3 -m strata bench decode $F --device cuda --ctx 4096 --prompt-tokens 32 --tokens 24 \
   --vram-budget 24
 part full_prompt12 150 python3 -m strata bench prompt $F --device cuda --vram-budget 12 --ctx 4096,32768 --reps 1) &
wait
finish 24
