#!/usr/bin/env bash
# On the GPU machine (issue 4): the dp4a decode GEMV prototype (strata/kernels/moe/dp4a_gemv.py). First its tests on
# CUDA (the real dp4a instruction against float64 within the stated rounding bound), then tools/device/dp4a_probe.py
# --sweep: A3B's Q4_0 q/k/v, o, experts' gate/up and down, the float one-shot kernels against dp4a (with and without
# its quantize launch) and dp4a's tiles, each a chain of 16 launches over distinct weight copies in a CUDA graph.
# Run from the repo root with .whl carried (gguf); logs to $OUT; under 4 minutes. Batch line:
#   script dp4a 240        (parts.sh: nested, its files under the batch's logs as dp4a/)
set -uo pipefail
source tools/device/wheels.sh || exit 1
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
  git rev-parse --short HEAD 2>/dev/null
} 2>&1 | tee "$OUT/dp4a_gpu.txt"
timeout 70 python3 -m pytest -q -p no:cacheprovider tests/kernels/moe/test_dp4a_gemv.py 2>&1 \
  | tee "$OUT/dp4a_tests_cuda.txt"
trc=${PIPESTATUS[0]}
timeout 160 python3 tools/device/dp4a_probe.py --sweep --budget 125 2>&1 | tee "$OUT/dp4a_probe.txt"
prc=${PIPESTATUS[0]}
echo "tests rc=$trc probe rc=$prc" | tee -a "$OUT/dp4a_gpu.txt"
[ "$trc" = 0 ] && [ "$prc" = 0 ]
