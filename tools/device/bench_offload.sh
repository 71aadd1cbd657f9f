#!/usr/bin/env bash
# On the GPU machine: `strata bench decode` on the Qwen3-30B-A3B shape (Q4_0) with the experts offloaded behind a
# 12 and a 24 GiB VRAM budget, with no expert cache at all (every expert on the CPU), and all resident.
# Run from the repo root with .whl carried (gguf); logs to $OUT.
set -uo pipefail
source tools/device/wheels.sh || exit 1
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/models; mkdir -p $M
TOKENS=${TOKENS:-12}
[ -f $M/a3b.gguf ] || python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 -o $M/a3b.gguf
python3 -m strata info $M/a3b.gguf --plan --vram-budget 12 | tail -8 | tee "$OUT/plan12.txt"
for opts in "--vram-budget 12" "--vram-budget 24" "--vram-budget 12 --pcie-frac 0.5" "--expert-cache 0" ""; do
  echo "== bench decode $opts" | tee -a "$OUT/bench_decode.txt"
  timeout 150 python3 -m strata bench decode $M/a3b.gguf --device cuda --tokens $TOKENS --prompt-tokens 32 $opts \
    2>&1 | grep -v "^device\|^dense\|^KV\|^work" | tee -a "$OUT/bench_decode.txt"
done
