#!/usr/bin/env bash
# One device call on two H200s (session 5, middle), after the branches' checkpoint merge: their sweeps, from which
# the defaults are set, and the full-size qwen4exp at 12 GiB (issue 4 on Strata's own shape). Card 0: the streamed
# GEMV sweep (gemv3.sh), then the prompt-attention sweep and parity table (pattn3.sh). Card 1: the fused prompt-expert
# parity and sweep (fused3.sh), then `bench decode --vram-budget 12` on the full qwen4exp, written meanwhile.
# Carry .whl and .devcache.
set -uo pipefail
BUDGET=${BUDGET:-470}
source tools/device/parts.sh || exit 1
# qwen4exp writes two shards (NAME-00001-of-00002.gguf, the second the n-gram table), each renamed when complete.
(python3 -m strata make-model --arch qwen4exp --preset full -o $M/q4x.gguf > $L/make_q4x.log 2>&1; echo "q4x written at ${SECONDS}s" >> $L/times.txt) &
Q4X=$M/q4x-00001-of-00002.gguf
wait_for() { while [ ! -f "$1" ] && [ $SECONDS -lt $((BUDGET - 40)) ]; do sleep 2; done; }
script() {  # script NAME CAP: a branch's device script, its files in $L/NAME (skipped when it is not there)
  [ -f tools/device/$1.sh ] || { echo "$1: no script" | tee -a $L/times.txt; return; }
  part "$1" "$2" env OUT=$L/$1 BUDGET=$(( $2 - 10 )) bash tools/device/$1.sh
}
(export CUDA_VISIBLE_DEVICES=0
 script gemv3 270
 script pattn3 190) &
(export CUDA_VISIBLE_DEVICES=1
 script fused3 270
 wait_for $Q4X
 part q4x_decode_12 190 python3 -m strata bench decode $Q4X --device cuda --ctx 4096 --tokens 24 --prompt-tokens 32 \
   --vram-budget 12) &
wait
echo "total ${SECONDS}s"
tar czf "$OUT/logs.tgz" -C $L .
save_cache
cat $L/times.txt
for f in $L/*.log $L/*/summary.txt; do [ -f "$f" ] || continue; echo "=== $f"; grep -v "^\s*$" "$f" | grep -v "^-\{20\}" | tail -n 14 | cut -c1-220; done
