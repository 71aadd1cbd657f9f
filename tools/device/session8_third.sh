#!/usr/bin/env bash
# Session 8's third call, two H200s (nvidia-h200-x2), every branch but imma3 merged, STRATA_PDL on by default and
# the fp16 cache's chunk rule without the context-wide mask; carry .whl and .devcache. Under 8 minutes.
# Host: the full-size qwen4exp file (~200 s) and the A3B file (~90 s) are made at the start.
# Card 0: PDL's bytes where the second call did not look (the tiny qwen4exp; A3B at 12 GiB behind the expert cache),
#   A3B decode with issue 4's command (12 GiB, --tokens 256) and all resident, then the full-size qwen4exp's decode
#   at 12 GiB.
# Card 1: the prompt experts' table with the stricter floor, then the full-size qwen4exp's prompt at 12 GiB (issue
#   6's command) with the default fp16 cache (selected-cells kernel, n-gram rows ahead, larger chunks), the same
#   with balanced routing (a trained model's load on the streaming path), and the int8 cache chunk by chunk
#   (session 7's slow int8 32K).
set -uo pipefail
BUDGET=${BUDGET:-470}
source tools/device/parts.sh || exit 1
Q=/tmp/q4x; mkdir -p $Q
F=$Q/full-00001-of-00002.gguf A=$M/a3b.gguf T=$M/q4x-tiny-00001-of-00002.gguf
(nice -n 5 python3 -m strata make-model --arch qwen4exp --preset full -o $Q/full.gguf > $L/make_full.log 2>&1 \
  && touch $Q/made) &
(python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 -o $M/a3b.tmp.gguf \
  > $L/make_a3b.log 2>&1 && mv $M/a3b.tmp.gguf $A) &
(export CUDA_VISIBLE_DEVICES=0
 python3 -m strata make-model --arch qwen4exp --preset tiny --quant Q8_0 -o $M/q4x-tiny.gguf > $L/make_tiny.log 2>&1
 part pdl_qwen4exp 45 python3 tools/device/pdl_check.py $T --tokens 24 --modes 1,3
 while [ ! -f $A ] && [ $SECONDS -lt 200 ]; do sleep 2; done
 part pdl_a3b_12 50 python3 tools/device/pdl_check.py $A --tokens 32 --vram-budget 12 --modes 1,3
 D="python3 -m strata bench decode $A --device cuda --ctx 4096 --prompt-tokens 32"
 part a3b_12 50 $D --tokens 256 --vram-budget 12
 part a3b_resident 35 $D --tokens 64 --vram-budget 24
 while [ ! -f $Q/made ] && [ $SECONDS -lt 330 ]; do sleep 2; done
 part full_12 110 python3 -m strata bench decode $F --device cuda --ctx 4096 --prompt-tokens 32 --tokens 64 \
   --vram-budget 12) &
(export CUDA_VISIBLE_DEVICES=1
 part moe_prefill 40 python3 -m strata bench moe-prefill --only "Q2_0 / Q2_0" --tokens 2048,16384 --paths mmq,fused
 while [ ! -f $Q/made ] && [ $SECONDS -lt 260 ]; do sleep 2; done
 P="python3 -m strata bench prompt $F --device cuda --vram-budget 12 --ctx 4096,32768 --reps 1"
 part prompt_fp16 90 $P
 part prompt_balanced 80 $P --routing balanced
 part chunks_int8 60 python3 tools/device/prompt_chunks_check.py $F --tokens 32768 --vram-budget 12 --only int8) &
wait
finish 18
