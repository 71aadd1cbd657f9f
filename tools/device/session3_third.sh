#!/usr/bin/env bash
# One device call (session 3, third, lean): the fused decode kernels (RMSNorm, RoPE, routing, dense-cache attention)
# on CUDA: their tests, captured decode against step by step on the small qwen3moe, the A3B-shape decode profile.
set -uo pipefail
BUDGET=${BUDGET:-300}
source tools/device/parts.sh || exit 1
part tests_cuda 90 python3 -m pytest -q -p no:cacheprovider tests/kernels/pointwise tests/kernels/attention/test_decode.py
part graphs_qwen3moe 80 python3 tools/device/decode_graphs_check.py $M 24 qwen3moe
part make_a3b 120 python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 -o $M/a3b.gguf
part profile_graphs 60 python3 tools/device/profile_decode.py $M/a3b.gguf --graphs on --steps 8
echo "total ${SECONDS}s"
tar czf "$OUT/logs.tgz" -C $L .
for f in $L/*.log; do echo "=== $f"; grep -v "^\s*$" "$f" | grep -v "^-\{20\}" | tail -n 14 | cut -c1-200; done
