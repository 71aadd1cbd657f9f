#!/usr/bin/env bash
# On the GPU machine: the MoE prompt-kernel tests on CUDA (compiled kernels against float64 at small shapes), then
# the parity tool at full shape (N 2560, FF 640, 512 experts, top 10): Q2_0 / Q2_0 at 2048, 8192 and 16384 tokens,
# the native packs at 2048. Run from the repo root with .whl carried (gguf); logs to $OUT; about 7 minutes at most.
set -uo pipefail
source tools/device/wheels.sh || exit 1
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
  git rev-parse --short HEAD 2>/dev/null
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } 2>&1 | tee "$OUT/moe_gpu.txt"
timeout 180 python3 -m pytest -q tests/kernels/moe --durations=8 2>&1 | tee "$OUT/moe_tests_cuda.txt"
timeout 150 python3 -m strata.bench.moe_prefill --only "Q2_0 / Q2_0" --tokens 2048,8192,16384 2>&1 \
  | tee "$OUT/moe_prefill_q2_0.txt"
timeout 120 python3 -m strata.bench.moe_prefill --tokens 2048 \
  --only "IQ2_XS / Q2_0,IQ3_XXS / Q2_0,IQ3_S / Q2_0,IQ4_XS / IQ4_NL,Q4_K / Q2_0" 2>&1 | tee "$OUT/moe_prefill_native.txt"
