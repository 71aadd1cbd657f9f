#!/usr/bin/env bash
# On the GPU machine: CUDA parity of the engine against its CPU path, then `strata bench generate` on the
# `small` qwen3moe (CPU and GPU) and on the full Qwen3-30B-A3B shape (Q4_0, the shape of peer-figures-h200.md).
# Run from the repo root with .whl carried (gguf); writes logs to $OUT.
set -uo pipefail
source tools/device/wheels.sh || exit 1
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/models; mkdir -p $M
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/gpu.txt"
git rev-parse --short HEAD 2>/dev/null | tee -a "$OUT/gpu.txt"
python3 -m pytest -q tests/quant 2>&1 | tail -3 | tee "$OUT/quant_tests_cuda.txt"
python3 tools/device/check_cuda.py 2>&1 | tee "$OUT/check_cuda.txt"
python3 -m strata make-model --arch qwen3moe --preset small --quant Q4_K -o $M/small.gguf
for dev in cpu cuda; do
  python3 -m strata bench generate $M/small.gguf --device $dev --prompt-tokens 128 --gen-tokens 32 2>&1 | tee -a "$OUT/bench_small.txt"
done
if [ "${BIG:-1}" = 1 ]; then
  time python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 -o $M/a3b.gguf
  python3 -m strata bench generate $M/a3b.gguf --device cuda --prompt-tokens 512 --gen-tokens 32 --reps 2 2>&1 | tee "$OUT/bench_a3b.txt"
fi
