#!/usr/bin/env bash
# Speculative decoding on the GPU (issue 10), `strata bench spec` on synthetic qwen3next models that carry an MTP
# block: per --spec 1..4, decode tok/s, the speedup over --spec 1, tokens per verify window, acceptance by draft
# position, and "greedy = plain" (the tokens equal plain greedy decoding's); before that, the cost of a verify window
# of 1..4 rows. Random weights: MTP drafts are rarely accepted and prompt-lookup ones (--suffix-draft) often, so the
# runs show the cost side and the break-even acceptance; acceptance on real text comes from the trained default model
# (strata/data/default-model) when it is there.
# Parts: small (cuda), A3B shape all resident, A3B shape with experts offloaded (window = union of missed experts).
# Run from the repo root with .whl carried; writes logs to $OUT. BIG=0 skips the A3B shape.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/models; mkdir -p $M
source tools/device/wheels.sh || exit 1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
git rev-parse --short HEAD 2>/dev/null | tee -a "$OUT/gpu.txt"
timeout 150 bash -c "python3 -m strata make-model --arch qwen3next --preset small --quant Q4_K --mtp -o $M/next-small.gguf \
  && python3 -m strata bench spec $M/next-small.gguf --device cuda --prompt-tokens 256 --gen-tokens 64 \
  && python3 -m strata bench spec $M/next-small.gguf --device cuda --prompt-tokens 256 --gen-tokens 64 --suffix-draft 3" \
  > "$OUT/spec_small.log" 2>&1; echo "small rc=$?"; grep -E "^\||verify|pays|model" "$OUT/spec_small.log"
# The trained default model (real text, its trained MTP head when its GGUF was exported with one): real acceptance.
D=strata/data/default-model/strata-default-qwen3next-q8_0.gguf
if [ -f "$D" ]; then
  timeout 150 bash -c "python3 -m strata bench spec $D --device cuda --prompt-tokens 256 --gen-tokens 128 \
    && python3 -m strata bench spec $D --device cuda --prompt-tokens 256 --gen-tokens 128 --suffix-draft 3 --spec-min-p 0.3" \
    > "$OUT/spec_default.log" 2>&1; echo "default rc=$?"; grep -E "^\||verify|pays|model" "$OUT/spec_default.log"
fi
if [ "${BIG:-1}" = 1 ]; then
  timeout 400 bash -c "python3 -m strata make-model --arch qwen3next --preset qwen3-30b-a3b --quant Q4_0 --mtp -o $M/next-a3b.gguf \
    && python3 -m strata bench spec $M/next-a3b.gguf --device cuda --prompt-tokens 512 --gen-tokens 64 --suffix-draft 3 \
    && python3 -m strata bench spec $M/next-a3b.gguf --device cuda --prompt-tokens 512 --gen-tokens 32 --suffix-draft 3 \
         --windows 1,2,4 --vram-budget 10" > "$OUT/spec_a3b.log" 2>&1; echo "a3b rc=$?"
  grep -E "^\||verify|pays|model" "$OUT/spec_a3b.log"
fi
