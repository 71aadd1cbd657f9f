#!/usr/bin/env bash
# On the GPU machine: the gated delta rule (GatedDeltaNet) at Qwen3-Next's size — fla-core's chunk and
# fused-recurrent kernels and our torch forms against a float64 step-by-step run, ms and error side by side.
# Carry in .whl/: gguf-0.19.0, fla_core-0.6.0, einops-0.8.2, packaging (fla-core imports it). Run from the repo
# root; logs go to $OUT. About 1-3 minutes, most of it fla's Triton autotuning on first calls.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  git rev-parse --short HEAD 2>/dev/null
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  python3 -c "import fla; print('fla-core', fla.__version__)" 2>&1 | tail -1
} | tee "$OUT/gdn_env.txt"
# The kernel tests, with the fla-on-CUDA one that CPU machines skip.
python3 -m pytest -q -rs tests/kernels/gdn 2>&1 | tail -4 | tee "$OUT/gdn_tests_cuda.txt"
# Qwen3-Next's GDN: 16 q/k heads, 32 v heads of 128, a 4096-token prompt in bf16 (the previous note: fla's chunk
# agreed with float64 to 3.7e-3 at T=1024), then the same in float32, then qwen4exp's 48 v heads.
timeout 150 python3 -m strata.kernels.gdn.parity --tokens 4096 --k-heads 16 --v-heads 32 --dim 128 --dtype bfloat16 \
  2>&1 | tee "$OUT/gdn_parity.txt"
timeout 60 python3 -m strata.kernels.gdn.parity --tokens 4096 --k-heads 16 --v-heads 32 --dim 128 --dtype float32 \
  2>&1 | tee -a "$OUT/gdn_parity.txt"
timeout 60 python3 -m strata.kernels.gdn.parity --tokens 4096 --k-heads 16 --v-heads 48 --dim 128 --dtype bfloat16 \
  2>&1 | tee -a "$OUT/gdn_parity.txt"
grep -c FAIL "$OUT/gdn_parity.txt" | sed 's/^/FAIL lines: /' | tee -a "$OUT/gdn_parity.txt"
