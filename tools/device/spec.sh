#!/usr/bin/env bash
# Speculative decoding on the GPU (issue 10): verify windows and MTP drafts through captured CUDA graphs against
# captured plain decode. BIG=0 part (under 4 minutes, BUDGET0): 1) `strata bench spec` on the trained default model
# (real text, its trained MTP head; its 32-unit experts now take the decode GEMVs, so everything captures): per
# --spec 1..4 decode tok/s, the speedup over --spec 1, tokens per window, acceptance by draft position, "greedy =
# plain", then where a window's time goes (draft / verify / accept + keep / host loop, ms and in decode steps);
# 2) tools/device/spec_mtp_check.py: captured MTP drafts equal eager ones, host syncs per window; 3)
# tools/device/spec_windows_check.py: captured windows against eager ones (argmax, logits, states after rollback).
# BIG part: the Qwen3-30B-A3B shape with a random MTP block (the cost side: drafts rarely accepted), all resident,
# then with experts offloaded (--vram-budget 10: a window's misses are the union over its rows); its model file is
# written in the background (nice'd) while the BIG=0 part runs. BIG=0 (default) runs the first part only, BIG=1
# both, BIG=only the A3B shape alone. Run from the repo root with .whl carried; logs to $OUT (at most 6 files). Every part
# is capped so the whole stays under 8 minutes (a part that would start past the budget is skipped and says so).
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
show() { grep -hE "^\||^decode step|^verify|pays|^model|^where|ALL OK|FAILURES|skipped|rror" "$@"; }
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; git rev-parse --short HEAD 2>/dev/null; } \
  | tee "$OUT/gpu.txt"
BIG=${BIG:-0}
BUDGET0=${BUDGET0:-230}  # the BIG=0 part: under 4 minutes
A=$M/next-a3b.gguf
MAKER=
if [ "$BIG" != 0 ] && [ ! -f $A ]; then  # written while the BIG=0 part runs
  (timeout $(cap 200) nice -n 19 python3 -m strata make-model --arch qwen3next --preset qwen3-30b-a3b --quant Q4_0 \
    --mtp -o $M/next-a3b.tmp.gguf > "$OUT/make_a3b.txt" 2>&1 && mv $M/next-a3b.tmp.gguf $A) &
  MAKER=$!
fi
if [ "$BIG" != only ]; then
# 1) The trained default model (real text, its trained MTP head): its experts (32 hidden units) take the decode
# GEMVs, so plain decode, the verify windows and the MTP drafts all run as captured graphs; the table, then where a
# window's time goes (draft / verify / accept + keep).
D=strata/data/default-model/strata-default-qwen3next-q8_0.gguf
run 60 "$OUT/spec_default.txt" python3 -m strata bench spec $D --device cuda --prompt-tokens 256 --gen-tokens 96
run 45 "$OUT/spec_default.txt" python3 -m strata bench spec $D --device cuda --prompt-tokens 256 --gen-tokens 96 \
  --suffix-draft 3 --spec-min-p 0.3
show "$OUT/spec_default.txt"
# 2) Captured MTP drafts against eager ones (same drafts), host syncs per window, greedy = plain.
run 60 "$OUT/mtp_check.txt" python3 tools/device/spec_mtp_check.py $M 48
show "$OUT/mtp_check.txt"
# 3) Captured windows against eager windows (rows, states after rollback), whatever is left of the part's budget.
left=$((BUDGET0 - SECONDS)); [ "$left" -gt 20 ] && run "$left" "$OUT/windows_check.txt" \
  python3 tools/device/spec_windows_check.py $M 40
show "$OUT/windows_check.txt" 2>/dev/null
fi
if [ "$BIG" != 0 ]; then
  # The Qwen3-30B-A3B shape (random MTP block: the cost side), all resident, then with experts offloaded.
  while [ ! -f $A ] && [ -n "$MAKER" ] && kill -0 $MAKER 2>/dev/null && [ $SECONDS -lt $((BUDGET - 60)) ]; do sleep 2; done
  [ -f $A ] || { echo "no A3B model file (make_a3b.txt)"; tail -3 "$OUT/make_a3b.txt"; }
  run 90 "$OUT/spec_a3b.txt" python3 -m strata bench spec $A --device cuda --prompt-tokens 512 --gen-tokens 48 \
    --suffix-draft 3 --reps 1
  run 90 "$OUT/spec_a3b.txt" python3 -m strata bench spec $A --device cuda --prompt-tokens 512 --gen-tokens 24 \
    --suffix-draft 3 --reps 1 --windows 1,2,4 --vram-budget 10
  show "$OUT/spec_a3b.txt"
fi
echo "total ${SECONDS}s"
