#!/usr/bin/env bash
# On the GPU machine: captured decode (engine/decode.py). 1) graph decode picks the same tokens as step-by-step
# decode on small synthetic qwen3moe / qwen3next models (resident, int8 KV, experts behind the cache);
# 2) `strata bench decode` on the Qwen3-30B-A3B shape (Q4_0), all resident and with --vram-budget 12, graphs on
# and off (--no-graphs). Carry .whl (gguf, fla-core). Tables to $OUT; each part has its own time cap (< 8 min).
set -uo pipefail
source tools/device/wheels.sh || exit 1
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/models; mkdir -p $M
TOKENS=${TOKENS:-32}
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; git rev-parse --short HEAD 2>/dev/null; } \
  | tee "$OUT/gpu.txt"
timeout 150 python3 tools/device/decode_graphs_check.py $M 48 2>&1 | tee "$OUT/parity.txt"
echo "parity rc=${PIPESTATUS[0]}" | tee -a "$OUT/parity.txt"
[ -f $M/a3b.gguf ] || timeout 150 python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 \
  -o $M/a3b.gguf 2>&1 | tail -2
for placement in "" "--vram-budget 12"; do
  for graphs in "" "--no-graphs"; do
    echo "== bench decode ${placement:-all resident} ${graphs:-graphs}" | tee -a "$OUT/bench_decode.txt"
    timeout 75 python3 -m strata bench decode $M/a3b.gguf --device cuda --ctx 4096 --tokens $TOKENS \
      --prompt-tokens 32 $placement $graphs 2>&1 | grep -v "^dense\|^KV\|^work" | tee -a "$OUT/bench_decode.txt"
  done
done
grep -h "^decode\|^floor\|graphs off\|Error" "$OUT/bench_decode.txt"
