#!/usr/bin/env bash
# Session 8's second call, two H200s (nvidia-h200-x2), branches pdl, qsafp16 and ngram merged; carry .whl and .devcache.
# Under 9.5 minutes.
# Card 0: branch pdl's batch (STRATA_PDL modes on the A3B decode step: tests, --pdl-sweep, bytes, profiles); then
#   branch ngram's (qwen4exp's n-gram rows gathered ahead on a host thread: bytes, wall, profiles with --syncs).
# Card 1: branch qsafp16's batch (QSA's selected attention over the fp16 cache through a kernel: tests, sweep,
#   logits vs the dense mask, 12-layer profiles); then the offloaded 32K prompt chunk by chunk, each cache.
set -uo pipefail
BUDGET=${BUDGET:-560}
source tools/device/parts.sh || exit 1
F=$M/q4x12-00001-of-00002.gguf
(export CUDA_VISIBLE_DEVICES=0
 script pdl 325
 while [ ! -f $F ] && [ $SECONDS -lt 420 ]; do sleep 2; done
 script ngram 230) &
(export CUDA_VISIBLE_DEVICES=1
 script qsafp16 335
 part prompt_chunks 190 python3 tools/device/prompt_chunks_check.py $F --tokens 32768 --vram-budget 4.4) &
wait
finish 24
