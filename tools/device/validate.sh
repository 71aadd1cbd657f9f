#!/usr/bin/env bash
# One device call: what the GPU machine has (for carrying wheels), the CUDA kernel tests, the CUDA-only engine paths
# against their references (validate_paths.py), tiny Qwen3-Next on CUDA (gdn.sh), and `bench generate` on the
# Qwen3-30B-A3B shape. Each part has its own time cap. Carry .whl (gguf, fla-core).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source tools/device/wheels.sh || exit 1
export PYTHONUNBUFFERED=1
{ python3 --version; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; git rev-parse --short HEAD
  python3 -m pip list 2>/dev/null | grep -iE "^(torch|triton|transformers|safetensors|regex|huggingface|tokenizers|pyyaml|numpy|tqdm|packaging|filelock|fsspec|jinja2|numba|einops|typer|click|httpx|hf-xet) " ; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
timeout 200 python3 -m pytest -x -p no:cacheprovider tests/kernels tests/engine/test_kv_int8.py tests/engine/test_expert_kernel_glue.py \
  > "$OUT/part_tests.log" 2>&1; echo "tests rc=$?"; tail -3 "$OUT/part_tests.log"
mkdir -p /tmp/models
timeout 120 bash -c 'python3 -m strata make-model --arch qwen3moe --preset small --quant Q4_K -o /tmp/models/small.gguf \
  && python3 tools/device/validate_paths.py /tmp/models/small.gguf' > "$OUT/part_paths.log" 2>&1; echo "paths rc=$?"
tail -5 "$OUT/part_paths.log"
timeout 100 bash tools/device/gdn.sh > "$OUT/part_gdn.log" 2>&1; echo "gdn rc=$?"; tail -8 "$OUT/part_gdn.log"
timeout 150 bash -c 'python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_K -o /tmp/models/a3b.gguf \
  && python3 -m strata bench generate /tmp/models/a3b.gguf --device cuda --prompt-tokens 2048 --gen-tokens 32 --reps 2' \
  > "$OUT/part_a3b.log" 2>&1; echo "a3b rc=$?"; tail -12 "$OUT/part_a3b.log"
