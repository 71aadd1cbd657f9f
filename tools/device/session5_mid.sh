#!/usr/bin/env bash
# One device call on two H200s (session 5, middle): the host loop around the captured decode step (why
# `bench decode` took 8.8 ms a token where the step's GPU work is 3.5 ms), the full-size qwen4exp at 12 and 24 GiB
# (issue 4 on Strata's own shape), and the branches' device scripts at their checkpoint: the GEMV, fused prompt
# expert and prompt attention sweeps; q, k and v read by one matvec (decode_graphs_check, profile_decode). Card 0 and card 1 each run a queue; the model files are written beside them.
# Carry .whl and .devcache.
set -uo pipefail
BUDGET=${BUDGET:-540}
source tools/device/parts.sh || exit 1
(python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 -o $M/a3b.tmp.gguf > $L/make_a3b.log 2>&1 \
  && mv $M/a3b.tmp.gguf $M/a3b.gguf) &
# qwen4exp writes two shards (NAME-00001-of-00002.gguf, the second the n-gram table), each renamed when complete.
(python3 -m strata make-model --arch qwen4exp --preset full -o $M/q4x.gguf > $L/make_q4x.log 2>&1) &
Q4X=$M/q4x-00001-of-00002.gguf
wait_for() { while [ ! -f "$1" ] && [ $SECONDS -lt $((BUDGET - 40)) ]; do sleep 2; done; }
script() {  # script NAME CAP: a branch's device script, its files in $L/NAME (skipped when it is not there)
  [ -f tools/device/$1.sh ] || { echo "$1: no script" | tee -a $L/times.txt; return; }
  part "$1" "$2" env OUT=$L/$1 BUDGET=$(( $2 - 10 )) bash tools/device/$1.sh
}
(export CUDA_VISIBLE_DEVICES=0
 script gemv3 170
 wait_for $M/a3b.gguf
 part host_loop 70 python3 tools/device/host_loop.py $M/a3b.gguf --steps 32
 part host_loop_12 60 python3 tools/device/host_loop.py $M/a3b.gguf --steps 32 --vram-budget 12
 script fused3 170) &
(export CUDA_VISIBLE_DEVICES=1
 part graphs_check 50 python3 tools/device/decode_graphs_check.py $M 16 qwen3moe
 script pattn3 170
 part profile_a3b 50 python3 tools/device/profile_decode.py $M/a3b.gguf --graphs on --steps 8
 wait_for $Q4X
 part q4x_info 30 python3 -m strata info $Q4X --plan --vram-budget 12
 part q4x_decode_12 120 python3 -m strata bench decode $Q4X --device cuda --ctx 4096 --tokens 32 --prompt-tokens 32 \
   --vram-budget 12
 part q4x_decode_24 100 python3 -m strata bench decode $Q4X --device cuda --ctx 4096 --tokens 32 --prompt-tokens 32 \
   --vram-budget 24) &
wait
echo "total ${SECONDS}s"
tar czf "$OUT/logs.tgz" -C $L .
save_cache
cat $L/times.txt
for f in $L/*.log $L/*/summary.txt; do [ -f "$f" ] || continue; echo "=== $f"; grep -v "^\s*$" "$f" | grep -v "^-\{20\}" | tail -n 14 | cut -c1-220; done
