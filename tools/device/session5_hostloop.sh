#!/usr/bin/env bash
# One short device call on two H200s (session 5): where a decode token's wall time goes outside the GPU
# (tools/device/host_loop.py, A3B shape resident and at 12 GiB), q, k and v through one matvec (decode_graphs_check
# against step-by-step decode, profile_decode's kernel count), and the full-size qwen4exp at 12 GiB when its file
# is written in time. Carry .whl and .devcache.
set -uo pipefail
BUDGET=${BUDGET:-270}
source tools/device/parts.sh || exit 1
(python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 -o $M/a3b.tmp.gguf > $L/make_a3b.log 2>&1 \
  && mv $M/a3b.tmp.gguf $M/a3b.gguf) &
(python3 -m strata make-model --arch qwen4exp --preset full -o $M/q4x.gguf > $L/make_q4x.log 2>&1; echo "q4x written at ${SECONDS}s" >> $L/times.txt) &
Q4X=$M/q4x-00001-of-00002.gguf
wait_for() { while [ ! -f "$1" ] && [ $SECONDS -lt $((BUDGET - 40)) ]; do sleep 2; done; }
(export CUDA_VISIBLE_DEVICES=0
 wait_for $M/a3b.gguf
 part host_loop 70 python3 tools/device/host_loop.py $M/a3b.gguf --steps 32
 part host_loop_12 60 python3 tools/device/host_loop.py $M/a3b.gguf --steps 32 --vram-budget 12
 part profile_a3b 45 python3 tools/device/profile_decode.py $M/a3b.gguf --graphs on --steps 8 --top 12) &
(export CUDA_VISIBLE_DEVICES=1
 part graphs_check 50 python3 tools/device/decode_graphs_check.py $M 16 qwen3moe
 wait_for $Q4X
 part q4x_decode_12 100 python3 -m strata bench decode $Q4X --device cuda --ctx 4096 --tokens 24 --prompt-tokens 32 \
   --vram-budget 12) &
wait
echo "total ${SECONDS}s"
tar czf "$OUT/logs.tgz" -C $L .
cat $L/times.txt
for f in $L/*.log; do echo "=== $f"; grep -v "^\s*$" "$f" | grep -v "^-\{20\}" | tail -n 30 | cut -c1-200; done
