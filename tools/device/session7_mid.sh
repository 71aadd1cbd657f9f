#!/usr/bin/env bash
# Session 7's middle call, two H200s (nvidia-h200-x2), the helpers' checkpoints merged; carry .whl and .devcache.
# Card 0: branch pfstream2's prompt-streaming profile and end-to-end prompt (issue 6), then branch q4xwin's qwen4exp
#   verify windows through captured graphs, checked row by row and benchmarked (issue 10).
# Card 1: branch missbw's sweep of the decode misses' zero-copy GEMVs (issue 4); the prompt experts' launch shapes at
#   2,048 tokens (an end-to-end chunk's size; the defaults were swept at 16K); the A3B shape at 12 GiB with issue 4's
#   own command (--tokens 256); the
#   prompt's torch ops by call site (profile_prompt.py --stacks on 12 full-size qwen4exp layers).
set -uo pipefail
BUDGET=${BUDGET:-570}
source tools/device/parts.sh || exit 1
(export CUDA_VISIBLE_DEVICES=0
 script pfstream2 330
 script q4xwin 215) &
(export CUDA_VISIBLE_DEVICES=1
 (nice -n 10 python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 -o $M/a3b.tmp.gguf \
   > $L/make_a3b.log 2>&1 && mv $M/a3b.tmp.gguf $M/a3b.gguf) &
 part pf_sweep_2k 110 python3 -m strata.bench.moe_prefill --only "Q2_0 / Q2_0" --tokens 2048 --paths mmq,fused \
   --sweep --reps 3
 script missbw 240
 while [ ! -f $M/a3b.gguf ] && [ $SECONDS -lt 420 ]; do sleep 2; done
 A="python3 -m strata bench decode $M/a3b.gguf --device cuda --ctx 4096 --prompt-tokens 32"
 part a3b_resident 40 $A --tokens 64 --vram-budget 24
 R=$(sed -n "s/^GPU step *\([0-9.]*\) ms.*/\1/p" $L/a3b_resident.log | head -n 1); R=${R:-resident}
 part a3b_12 70 $A --tokens 256 --vram-budget 12 --gpu-floor $R
 # which model lines issue the prompt's slow torch ops (12 full-size layers, written by pfstream2.sh on card 0)
 while [ ! -f $M/q4x12-00001-of-00002.gguf ] && [ $SECONDS -lt 480 ]; do sleep 2; done
 part profile_stacks 75 python3 tools/device/profile_prompt.py $M/q4x12-00001-of-00002.gguf --tokens 4096 --rows 25 \
   --stacks) &
wait
finish 20
