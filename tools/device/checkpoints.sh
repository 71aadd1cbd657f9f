#!/usr/bin/env bash
# On the GPU machine: conversation checkpoints on CUDA (host pinned copies of the KV cells and GatedDeltaNet
# states). `strata bench checkpoints` on the small qwen3moe (fp16 and int8 paged KV) and qwen3next, then on the
# Qwen3-30B-A3B shape with an 8192-token conversation: each run exits 1 unless the restored follow-up's logits equal
# the live cache's bit for bit and stay within the bound of a full read. Carry .whl (gguf); logs to $OUT.
set -uo pipefail
source tools/device/wheels.sh || exit 1
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/models; mkdir -p $M
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/gpu.txt"
git rev-parse --short HEAD 2>/dev/null | tee -a "$OUT/gpu.txt"
bench() { python3 -m strata bench checkpoints "$@" --device cuda 2>&1 | tee -a "$OUT/bench_checkpoints.txt"; echo "rc=${PIPESTATUS[0]}" | tee -a "$OUT/bench_checkpoints.txt"; }
python3 -m strata make-model --arch qwen3moe --preset small --quant Q4_K -o $M/small.gguf
python3 -m strata make-model --arch qwen3next --preset small --quant Q4_K -o $M/small-next.gguf
bench $M/small.gguf --prompt-tokens 4096
bench $M/small.gguf --prompt-tokens 4096 --kv-dtype int8
bench $M/small-next.gguf --prompt-tokens 4096
if [ "${BIG:-1}" = 1 ]; then
  python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 -o $M/a3b.gguf
  bench $M/a3b.gguf --prompt-tokens 8192 --follow-tokens 64 --reps 2
fi
