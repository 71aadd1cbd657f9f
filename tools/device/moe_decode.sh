#!/usr/bin/env bash
# On the GPU machine: the decode expert-kernel tests on CUDA (compiled kernels against float64 at small shapes), then
# the decode bench (A3B Q4_0 / Q4_K, qwen4exp Q2_0 at T = 1, with a launch-configuration sweep, and a CUDA graph
# replayed with new ids). Run from the repo root with .whl carried (gguf); logs to $OUT; under 5 minutes.
set -uo pipefail
source tools/device/wheels.sh || exit 1
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
  git rev-parse --short HEAD 2>/dev/null
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} 2>&1 | tee "$OUT/moe_decode_gpu.txt"
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/kernels/moe/test_gemv.py --durations=5 2>&1 \
  | tee "$OUT/moe_decode_tests_cuda.txt"
rc=${PIPESTATUS[0]}
timeout 180 python3 -m strata.bench.moe_decode --sweep 2>&1 | tee "$OUT/moe_decode_bench.txt"
brc=${PIPESTATUS[0]}
echo "tests rc=$rc bench rc=$brc" | tee -a "$OUT/moe_decode_gpu.txt"
[ "$rc" = 0 ] && [ "$brc" = 0 ]
