#!/usr/bin/env bash
# On the GPU machine: `strata bench matvec` (2048x4096, 4096x2048, 2048x151936 in Q4_0/Q8_0/Q4_K: the word kernel
# against the byte kernel it replaces, GB/s and % of the HBM floor, error vs float64), `strata bench moe-decode
# --sweep` on the A3B shapes (Q4_0, Q4_K: default tiles = word kernels, variants, and the byte kernels), then the
# GEMV tests on CUDA (compiled kernels against float64 at small shapes). Run from the repo root with .whl carried
# (gguf); logs to $OUT; under 4 minutes.
set -uo pipefail
source tools/device/wheels.sh || exit 1
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
  git rev-parse --short HEAD 2>/dev/null
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} 2>&1 | tee "$OUT/gemv_gpu.txt"
timeout 100 python3 -m strata bench matvec 2>&1 | tee "$OUT/gemv_bench_matvec.txt"
mrc=${PIPESTATUS[0]}
timeout 80 python3 -m strata bench moe-decode --shapes a3b-q4_0,a3b-q4_k --sweep 2>&1 \
  | tee "$OUT/gemv_bench_moe_decode.txt"
drc=${PIPESTATUS[0]}
timeout 55 python3 -m pytest -q -p no:cacheprovider tests/kernels/moe/test_gemv.py tests/kernels/quant/test_matvec.py \
  tests/kernels/quant/test_bench_matvec.py --durations=5 2>&1 | tee "$OUT/gemv_tests_cuda.txt"
rc=${PIPESTATUS[0]}
echo "matvec rc=$mrc moe-decode rc=$drc tests rc=$rc" | tee -a "$OUT/gemv_gpu.txt"
[ "$rc" = 0 ] && [ "$mrc" = 0 ] && [ "$drc" = 0 ]
