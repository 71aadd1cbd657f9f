#!/usr/bin/env bash
# One device call (session 3, third, lean): the fused decode kernels (RMSNorm, RoPE, routing, dense-cache attention)
# on CUDA: their tests, captured decode against step by step on the small qwen3moe, the A3B-shape decode profile.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/models; mkdir -p $M
L=/tmp/logs; mkdir -p $L
source tools/device/wheels.sh || exit 1
export PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-300}
part() {  # name cap command...
  local name=$1 cap=$2; shift 2
  local left=$((BUDGET - SECONDS)); [ "$left" -lt "$cap" ] && cap=$left
  if [ "$cap" -lt 20 ]; then echo "$name: skipped, out of time"; return; fi
  local t0=$SECONDS
  timeout "$cap" "$@" > "$L/$name.log" 2>&1; echo "$name rc=$? in $((SECONDS - t0))s" | tee -a "$L/times.txt"
}
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; git log -1 --format=%h; } | tee "$L/gpu.txt"
part tests_cuda 90 python3 -m pytest -q -p no:cacheprovider tests/kernels/pointwise tests/kernels/attention/test_decode.py
part graphs_qwen3moe 80 python3 tools/device/decode_graphs_check.py $M 24 qwen3moe
part make_a3b 120 python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 -o $M/a3b.gguf
part profile_graphs 60 python3 tools/device/profile_decode.py $M/a3b.gguf --graphs on --steps 8
echo "total ${SECONDS}s"
tar czf "$OUT/logs.tgz" -C $L .
for f in $L/*.log; do echo "=== $f"; grep -v "^\s*$" "$f" | grep -v "^-\{20\}" | tail -n 14 | cut -c1-200; done
