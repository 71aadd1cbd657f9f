#!/usr/bin/env bash
# Session 7's third call, two H200s (nvidia-h200-x2); carry .whl and .devcache. About 6 minutes.
# Card 0: issue 10's qwen4exp verify windows through captured graphs (q4xwin.sh: exact rows, bench spec, MTP drafts);
#   the hyper-connection prompt read's GEMMs on TF32 against float32 and float64 (bench hc-read --prompt 4096);
#   the misses' GEMVs when every expert hits, after the one-shot kernels' early exit (bench miss-bw, K = 0..2).
# Card 1: the A3B shape, resident and at 12 GiB with issue 4's command (--tokens 256; capture steps now left out);
#   then the full-size qwen4exp at 12 GiB (--tokens 64).
set -uo pipefail
BUDGET=${BUDGET:-380}
source tools/device/parts.sh || exit 1
Q=/tmp/q4x; mkdir -p $Q
(export CUDA_VISIBLE_DEVICES=0
 script q4xwin 215
 part hc_read 40 python3 -m strata.bench.hc_read --rows 1 --prompt 4096
 part miss_bw 60 python3 -m strata bench miss-bw --misses 0,1,2) &
(export CUDA_VISIBLE_DEVICES=1
 (nice -n 5 python3 -m strata make-model --arch qwen4exp --preset full -o $Q/full.gguf > $L/make_full.log 2>&1 \
   && touch $Q/made) &
 (python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 -o $M/a3b.tmp.gguf \
   > $L/make_a3b.log 2>&1 && mv $M/a3b.tmp.gguf $M/a3b.gguf)
 A="python3 -m strata bench decode $M/a3b.gguf --device cuda --ctx 4096 --prompt-tokens 32"
 part a3b_resident 35 $A --tokens 64 --vram-budget 24
 R=$(sed -n "s/^GPU step *\([0-9.]*\) ms.*/\1/p" $L/a3b_resident.log | head -n 1); R=${R:-resident}
 part a3b_12 50 $A --tokens 256 --vram-budget 12 --gpu-floor $R
 while [ ! -f $Q/made ] && [ $SECONDS -lt 260 ]; do sleep 2; done
 part full12 150 python3 -m strata bench decode $Q/full-00001-of-00002.gguf --device cuda --ctx 4096 \
   --prompt-tokens 32 --tokens 64 --vram-budget 12) &
wait
finish 16
