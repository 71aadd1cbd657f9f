#!/usr/bin/env bash
# Speculative decoding on the GPU (issue 10): verify windows through captured CUDA graphs against captured plain
# decode. 1) tools/device/spec_windows_check.py: captured windows of 1..4 rows against eager windows (argmax, logits,
# recurrent states after rollback) and free-running greedy --spec 2/3/4 against plain greedy; 2) `strata bench spec`
# on a small synthetic qwen3next with an MTP block, graphs on and off (--no-graphs): per --spec 1..4, decode tok/s,
# the speedup over --spec 1 (captured plain decode), tokens per window, acceptance by draft position and
# "greedy = plain", after the cost of a window of 1..4 rows in decode steps; 3) the trained default model (real
# text, real acceptance) when it is there; 4) the Qwen3-30B-A3B shape, all resident and with experts offloaded
# (--vram-budget 10: a window's misses are the union over its rows). Random weights: MTP drafts are rarely accepted
# and prompt-lookup ones (--suffix-draft) often, so the synthetic runs show the cost side and the break-even.
# Run from the repo root with .whl carried; logs to $OUT. BIG=0 skips the A3B shape, BIG=only runs it alone (when
# the other parts leave it too little of the budget). Every part is capped so the whole stays under 8 minutes (a
# part that would start past the budget is skipped and says so).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/models; mkdir -p $M
source tools/device/wheels.sh || exit 1
export PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-460}
cap() { local left=$((BUDGET - SECONDS)); [ "$left" -gt "$1" ] && echo "$1" || echo "$left"; }
run() {  # run LIMIT LOG COMMAND...: capped, appended to LOG, skipped when too little time is left
  local limit=$(cap "$1") log=$2; shift 2
  if [ "$limit" -lt 20 ]; then echo "skipped (out of time): $*" | tee -a "$log"; return; fi
  echo "== $*" >> "$log"; timeout "$limit" "$@" >> "$log" 2>&1; echo "rc=$? ($*)" | tee -a "$log"
}
show() { grep -hE "^\||^decode step|^verify|pays|^model|ALL OK|FAILURES|skipped|rror" "$@"; }
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; git rev-parse --short HEAD 2>/dev/null; } \
  | tee "$OUT/gpu.txt"
BIG=${BIG:-1}
if [ "$BIG" != only ]; then
run 150 "$OUT/windows_check.txt" python3 tools/device/spec_windows_check.py $M 40
show "$OUT/windows_check.txt"
S=$M/next-small.gguf
[ -f $S ] || run 60 "$OUT/spec_small.txt" python3 -m strata make-model --arch qwen3next --preset small --quant Q4_K \
  --mtp -o $S
for graphs in "" "--no-graphs"; do
  run 60 "$OUT/spec_small.txt" python3 -m strata bench spec $S --device cuda --prompt-tokens 256 --gen-tokens 48 \
    --suffix-draft 3 $graphs
done
show "$OUT/spec_small.txt"
# The trained default model (real text, its trained MTP head when its GGUF was exported with one): real acceptance.
D=strata/data/default-model/strata-default-qwen3next-q8_0.gguf
if [ -f "$D" ]; then
  run 60 "$OUT/spec_default.txt" python3 -m strata bench spec $D --device cuda --prompt-tokens 256 --gen-tokens 96
  run 60 "$OUT/spec_default.txt" python3 -m strata bench spec $D --device cuda --prompt-tokens 256 --gen-tokens 96 \
    --suffix-draft 3 --spec-min-p 0.3
  show "$OUT/spec_default.txt"
fi
fi
if [ "$BIG" != 0 ]; then
  A=$M/next-a3b.gguf
  [ -f $A ] || run 150 "$OUT/spec_a3b.txt" python3 -m strata make-model --arch qwen3next --preset qwen3-30b-a3b \
    --quant Q4_0 --mtp -o $A
  run 90 "$OUT/spec_a3b.txt" python3 -m strata bench spec $A --device cuda --prompt-tokens 512 --gen-tokens 48 \
    --suffix-draft 3 --reps 1
  run 90 "$OUT/spec_a3b.txt" python3 -m strata bench spec $A --device cuda --prompt-tokens 512 --gen-tokens 24 \
    --suffix-draft 3 --reps 1 --windows 1,2,4 --vram-budget 10
  show "$OUT/spec_a3b.txt"
fi
echo "total ${SECONDS}s"
