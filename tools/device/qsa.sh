#!/usr/bin/env bash
# On the GPU machine, from the repo root with .whl carried (gguf): the selection / Quest / kv-resident tests on CUDA
# (compiled kernels, pinned host pages), then `strata bench long-context` on synthetic `small` models: int8 KV,
# dense vs --qsa quest vs quest with --kv-resident, at 32K and 128K prompt tokens. Logs in $OUT; each step has its
# own time limit (about 20 minutes in all; LONG=0 skips the 128K run).
set -uo pipefail
source tools/device/wheels.sh || exit 1
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/models; mkdir -p $M
{
  nvidia-smi --query-gpu=name,memory.total,compute_cap --format=csv
  git rev-parse --short HEAD 2>/dev/null
} 2>&1 | tee "$OUT/gpu.txt"
rc=0
if python3 -c "import pytest" 2>/dev/null; then
  timeout 420 python3 -m pytest -q -p no:cacheprovider tests/engine/test_kv_selection.py tests/engine/test_quest.py \
    tests/engine/test_kv_resident.py tests/kernels/select/test_quest.py 2>&1 | tail -30 | tee "$OUT/qsa_tests.txt"
  rc=${PIPESTATUS[0]}
fi
python3 -m strata make-model --arch qwen3 --preset small --quant Q8_0 -o $M/small-qwen3.gguf >/dev/null
python3 -m strata make-model --arch qwen3next --preset small --quant Q8_0 -o $M/small-next.gguf >/dev/null
bench() {  # model prompt-tokens resident-cells log
  timeout 600 python3 -m strata bench long-context "$1" --device cuda --prompt-tokens "$2" --gen-tokens 16 \
    --resident "$3" 2>&1 | tee "$OUT/$4"
  return "${PIPESTATUS[0]}"
}
bench $M/small-qwen3.gguf 32768 8192 long_qwen3_32k.txt; b1=$?
bench $M/small-next.gguf 32768 8192 long_next_32k.txt; b2=$?
b3=0
if [ "${LONG:-1}" = 1 ]; then bench $M/small-qwen3.gguf 131072 16384 long_qwen3_128k.txt; b3=$?; fi
echo "tests rc=$rc bench rc=$b1 $b2 $b3" | tee -a "$OUT/gpu.txt"
[ "$rc" = 0 ] && [ "$b1" = 0 ] && [ "$b2" = 0 ] && [ "$b3" = 0 ]
