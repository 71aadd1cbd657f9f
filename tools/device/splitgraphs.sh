#!/usr/bin/env bash
# Captured decode across cards (engine/decode_split.py, issue 8). 1) The graphs rows of multigpu_check.py on small
# qwen3moe / qwen3next (Q4_K): the split's graphs against one card's graphs (resident: bound 1e-4, in practice 0;
# also through pinned host staging) and against the split's step-by-step decode (teacher-forced argmax, max rel err
# 2e-2, free-run tokens, tok/s), resident and with each card's expert cache; on --gpus 0,1 with two GPUs, else 0,0.
# 2) With two GPUs, `strata bench decode` on the A3B shape (Q4_0): one card at --vram-budget 2B against --gpus 0,1
# --vram-budget B with graphs and with --no-graphs (ALL=1 adds all resident); with one, the CLI path on --gpus 0,0.
# Run from the repo root with .whl carried; summary.txt + a tarball of the logs in $OUT; the whole under 8 minutes.
set -uo pipefail
source tools/device/wheels.sh || exit 1
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/models; mkdir -p $M; L=/tmp/splitgraphs_logs; mkdir -p $L
BUDGET=${BUDGET:-8}; TOTAL=${TOTAL:-450}
cap() { local left=$((TOTAL - SECONDS)); [ "$left" -gt "$1" ] && echo "$1" || echo "$left"; }
N=$(nvidia-smi -L | wc -l); GPUS=$([ "$N" -ge 2 ] && echo 0,1 || echo 0,0)
S="$OUT/summary.txt"
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; git rev-parse --short HEAD 2>/dev/null; echo "gpus $N"; } \
  2>&1 | tee "$S"
if [ "$N" -ge 2 ] && [ ! -f $M/a3b.gguf ]; then  # written on the CPU while the check runs on the GPUs
  (timeout 240 python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 -o $M/a3b.tmp.gguf \
    > $L/make_a3b.log 2>&1 && mv $M/a3b.tmp.gguf $M/a3b.gguf) &
fi
timeout "$(cap 200)" python3 tools/device/multigpu_check.py $M $GPUS graphs > $L/check_graphs.txt 2>&1
echo "graphs check --gpus $GPUS rc=$?" | tee -a "$S"
grep -E "PASS|FAIL" $L/check_graphs.txt | cut -c1-240 | tee -a "$S"
wait
if [ "$N" -ge 2 ]; then
  TWO=$(python3 -c "print(2 * $BUDGET)")
  RUNS=("--device cuda:0 --vram-budget $TWO|one card" "--gpus 0,1 --vram-budget $BUDGET|two cards, graphs"
        "--gpus 0,1 --vram-budget $BUDGET --no-graphs|two cards, step by step")
  [ "${ALL:-0}" = 1 ] && RUNS+=("--device cuda:0|one card, all resident" "--gpus 0,1|two cards, all resident")
  for run in "${RUNS[@]}"; do
    opts=${run%%|*}; name=${run##*|}; left=$(cap 60)
    echo "== $name: $opts" | tee -a $L/bench_decode.txt "$S"
    if [ "$left" -lt 20 ]; then echo "skipped: out of time" | tee -a "$S"; continue; fi
    timeout "$left" python3 -m strata bench decode $M/a3b.gguf $opts --ctx 4096 --tokens 32 2>&1 \
      | tee -a $L/bench_decode.txt | grep -E "^decode|^experts|graphs off|rror" | tee -a "$S"
  done
else
  for graphs in "" "--no-graphs"; do
    echo "== bench decode --gpus 0,0 $graphs" | tee -a "$S"
    timeout "$(cap 60)" python3 -m strata bench decode $M/split-qwen3moe.gguf --gpus 0,0 --tokens 32 $graphs \
      2>&1 | tee -a $L/bench_decode.txt | grep -E "^decode|graphs off|rror" | tee -a "$S"
  done
fi
echo "total ${SECONDS}s" | tee -a "$S"
tar -czf "$OUT/splitgraphs_logs.tgz" -C $L .
