#!/usr/bin/env bash
# One device call for the end of a session: the decode expert kernels, the GDN kernels and Qwen3-Next on CUDA,
# then `bench generate` on the Qwen3-30B-A3B shape (prompt chunks through the grouped prompt kernels). Each part
# has its own time cap so one slow part cannot take the others' time. Carry .whl (gguf, fla-core).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 170 bash tools/device/moe_decode.sh > "$OUT/part_moe_decode.log" 2>&1; echo "moe_decode rc=$?"
timeout 150 bash tools/device/gdn.sh > "$OUT/part_gdn.log" 2>&1; echo "gdn rc=$?"
timeout 170 bash -c 'source tools/device/wheels.sh && mkdir -p /tmp/models \
  && python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 -o /tmp/models/a3b.gguf \
  && python3 -m strata bench generate /tmp/models/a3b.gguf --device cuda --prompt-tokens 512 --gen-tokens 16 --reps 2' \
  > "$OUT/part_a3b.log" 2>&1; echo "a3b rc=$?"
tail -n 25 "$OUT"/part_*.log
