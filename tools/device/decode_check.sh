#!/usr/bin/env bash
# One device call: the dense-matvec kernel tests on CUDA, A3B-shape decode speed and its profile, then gdn.sh
# (fla autotuning needs ~3 minutes). Carry .whl.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/models
source tools/device/wheels.sh || exit 1
export PYTHONUNBUFFERED=1
timeout 60 python3 -m pytest -x -p no:cacheprovider tests/kernels/quant > "$OUT/part_tests.log" 2>&1; echo "tests rc=$?"; tail -2 "$OUT/part_tests.log"
timeout 200 bash -c 'python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_K -o /tmp/models/a3b.gguf \
  && python3 -m strata bench generate /tmp/models/a3b.gguf --device cuda --prompt-tokens 512 --gen-tokens 64 --reps 2 \
  && python3 tools/device/profile_decode.py /tmp/models/a3b.gguf 8' > "$OUT/part_a3b.log" 2>&1; echo "a3b rc=$?"
grep -E "prompt|decode|floor" "$OUT/part_a3b.log" | head -8
timeout 220 bash tools/device/gdn.sh > "$OUT/part_gdn.log" 2>&1; echo "gdn rc=$?"; tail -12 "$OUT/part_gdn.log"
