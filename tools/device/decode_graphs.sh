#!/usr/bin/env bash
# On the GPU machine: captured decode (engine/decode.py). 1) graph decode picks the same tokens as step-by-step
# decode on small synthetic qwen3moe / qwen3next models (resident, int8 KV, experts behind the cache);
# 2) `strata bench decode` on the Qwen3-30B-A3B shape (Q4_0), all resident and with --vram-budget 12, graphs on
# and off (--no-graphs). Carry .whl (gguf, fla-core). Tables to $OUT; every part is capped so the whole stays
# under 8 minutes (a part that would start past the budget is skipped and says so).
set -uo pipefail
source tools/device/wheels.sh || exit 1
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/models; mkdir -p $M
TOKENS=${TOKENS:-32}; BUDGET=${BUDGET:-470}
cap() { local left=$((BUDGET - SECONDS)); [ "$left" -gt "$1" ] && echo "$1" || echo "$left"; }
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; git rev-parse --short HEAD 2>/dev/null; } \
  | tee "$OUT/gpu.txt"
timeout "$(cap 110)" python3 tools/device/decode_graphs_check.py $M 48 2>&1 | tee "$OUT/parity.txt"
echo "parity rc=${PIPESTATUS[0]}" | tee -a "$OUT/parity.txt"
[ -f $M/a3b.gguf ] || timeout "$(cap 150)" python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b \
  --quant Q4_0 -o $M/a3b.gguf 2>&1 | tail -2
for run in ":" ":--no-graphs" "--vram-budget 12:" "--vram-budget 12:--no-graphs"; do
  placement=${run%%:*}; graphs=${run#*:}; limit=$([ -n "$placement" ] && echo 90 || echo 60)
  echo "== bench decode ${placement:-all resident} ${graphs:-(graphs)}" | tee -a "$OUT/bench_decode.txt"
  left=$(cap $limit); if [ "$left" -lt 20 ]; then echo "skipped: out of time" | tee -a "$OUT/bench_decode.txt"; continue; fi
  timeout "$left" python3 -m strata bench decode $M/a3b.gguf --device cuda --ctx 4096 --tokens $TOKENS \
    --prompt-tokens 32 $placement $graphs 2>&1 | grep -v "^dense\|^KV\|^work" | tee -a "$OUT/bench_decode.txt"
done
grep -h "^==\|^decode\|^floor\|^experts\|graphs off\|rror" "$OUT/bench_decode.txt"
echo "total ${SECONDS}s"
