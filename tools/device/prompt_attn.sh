#!/usr/bin/env bash
# On the GPU machine (H200, torch 2.11, Triton 3.6), from the repo root: the int8 KV / QSA selection / prompt and
# decode attention tests on CUDA (compiled kernels against their references), then the prompt-attention parity tool
# at its default shapes. Logs in $OUT; about 5 minutes (each step has its own time limit).
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{
  nvidia-smi --query-gpu=name,memory.total,compute_cap --format=csv
  git rev-parse --short HEAD 2>/dev/null
  python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__)"
} 2>&1 | tee "$OUT/gpu.txt"
rc=0
if python3 -c "import pytest" 2>/dev/null; then
  timeout 270 python3 -m pytest -q -p no:cacheprovider --durations=8 tests/kernels/attention tests/kernels/select \
    2>&1 | tail -60 | tee "$OUT/kernel_tests_cuda.txt"
  rc=${PIPESTATUS[0]}
else
  echo "pytest is not installed here: tests skipped" | tee "$OUT/kernel_tests_cuda.txt"
fi
timeout 270 python3 -m strata.bench.prompt_attn 2>&1 | tee "$OUT/prompt_attn_parity.txt"
prc=${PIPESTATUS[0]}
echo "tests rc=$rc parity rc=$prc" | tee -a "$OUT/gpu.txt"
[ "$rc" = 0 ] && [ "$prc" = 0 ]
