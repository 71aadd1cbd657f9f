#!/usr/bin/env bash
# On the GPU machine: streamed offloaded prompts. The slot-reading prompt kernels compiled on CUDA; streamed ==
# all-resident logits bytes on the `small` qwen3moe; then `strata bench prompt` on the Qwen3-30B-A3B shape (Q4_0)
# at --vram-budget 12 (experts streamed over PCIe) and all resident, contexts 4096 and 32768.
# Run from the repo root with .whl carried (gguf); logs to $OUT; under 8 minutes on an H200.
set -uo pipefail
source tools/device/wheels.sh || exit 1
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/models; mkdir -p $M
CTX=${CTX:-4096,32768}
{ nvidia-smi --query-gpu=name,memory.total --format=csv; git rev-parse --short HEAD 2>/dev/null; } 2>&1 | tee "$OUT/gpu.txt"
timeout 60 python3 -m pytest -q tests/kernels/moe/test_prefill_slots.py 2>&1 | tail -3 | tee "$OUT/slots_tests_cuda.txt"
timeout 90 python3 tools/device/check_prefill_stream.py 2>&1 | tee "$OUT/check_prefill_stream.txt"
[ -f $M/a3b.gguf ] || timeout 180 python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 -o $M/a3b.gguf
for opts in "--vram-budget 12" ""; do
  echo "== bench prompt --ctx $CTX $opts" | tee -a "$OUT/bench_prompt.txt"
  timeout 170 python3 -m strata bench prompt $M/a3b.gguf --device cuda --ctx $CTX $opts 2>&1 | tee -a "$OUT/bench_prompt.txt"
done
