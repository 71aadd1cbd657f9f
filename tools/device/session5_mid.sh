#!/usr/bin/env bash
# One device call on two H200s (session 5, middle), after the branches' checkpoint merge: their sweeps, from which
# the defaults are set, and speculation's figures. Card 0: the streamed GEMV sweep (gemv3.sh), then `bench spec` on
# the trained default model with captured windows and drafts (spec.sh, BIG=0). Card 1: the fused prompt-expert parity
# and sweep (fused3.sh), then the prompt-attention sweep and parity table (pattn3.sh).
# Carry .whl and .devcache.
set -uo pipefail
BUDGET=${BUDGET:-450}
source tools/device/parts.sh || exit 1
script() {  # script NAME CAP [ENV...]: a branch's device script, its files in $L/NAME (skipped when it is not there)
  local name=$1 cap=$2; shift 2
  [ -f tools/device/$name.sh ] || { echo "$name: no script" | tee -a $L/times.txt; return; }
  part "$name" "$cap" env OUT=$L/$name BUDGET=$(( cap - 10 )) "$@" bash tools/device/$name.sh
}
(export CUDA_VISIBLE_DEVICES=0
 script gemv3 220
 script spec 220 BUDGET0=200 BIG=0) &
(export CUDA_VISIBLE_DEVICES=1
 script fused3 220
 script pattn3 220) &
wait
echo "total ${SECONDS}s"
tar czf "$OUT/logs.tgz" -C $L .
save_cache
cat $L/times.txt
for f in $L/*.log $L/*/summary.txt $L/spec/*.txt; do [ -f "$f" ] || continue; echo "=== $f"; grep -v "^\s*$" "$f" | grep -v "^-\{20\}" | tail -n 14 | cut -c1-220; done
