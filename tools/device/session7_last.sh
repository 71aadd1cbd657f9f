#!/usr/bin/env bash
# Session 7's last call, two H200s (nvidia-h200-x2), every branch merged; carry .whl and .devcache. About 6.5 min.
# Card 0: branch imma2's sweep of imma configs at the five default shapes (issue 5: within 2x of the floor?), the
#   prompt experts at 2K (fused now on 64-row tiles below 96 rows an expert) and 16K, then the full-size qwen4exp's prompt at 12 GiB, 4K and 32K, with the int8 KV cache (QSA through the selection kernels).
# Card 1: the A3B shape at 12 GiB (--tokens 256), misses read in place (default) then copied first
#   (STRATA_MISSES_COPY=1, the same bytes); then the full-size prompt at 12 GiB with the default fp16 cache, after
#   branch pfstream2 (one gather launch a layer).
set -uo pipefail
BUDGET=${BUDGET:-390}
source tools/device/parts.sh || exit 1
Q=/tmp/q4x; mkdir -p $Q
F=$Q/full-00001-of-00002.gguf
P="python3 -m strata bench prompt $F --device cuda --vram-budget 12 --ctx 4096,32768 --reps 1"
(nice -n 5 python3 -m strata make-model --arch qwen4exp --preset full -o $Q/full.gguf > $L/make_full.log 2>&1 \
  && touch $Q/made) &
(export CUDA_VISIBLE_DEVICES=0
 script imma2 190
 part moe_prefill 35 python3 -m strata bench moe-prefill --only "Q2_0 / Q2_0" --tokens 2048,16384 --paths mmq,fused
 while [ ! -f $Q/made ] && [ $SECONDS -lt 280 ]; do sleep 2; done
 part prompt_int8 110 $P --kv-dtype int8) &
(export CUDA_VISIBLE_DEVICES=1
 python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 -o $M/a3b.gguf > $L/make_a3b.log 2>&1
 A="python3 -m strata bench decode $M/a3b.gguf --device cuda --ctx 4096 --prompt-tokens 32 --tokens 256 --vram-budget 12"
 part a3b_12 45 $A
 STRATA_MISSES_COPY=1 part a3b_12_copy 45 $A
 while [ ! -f $Q/made ] && [ $SECONDS -lt 280 ]; do sleep 2; done
 part prompt_fp16 110 $P) &
wait
finish 14
