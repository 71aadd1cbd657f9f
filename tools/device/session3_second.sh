#!/usr/bin/env bash
# One device call (session 3, second): after the first call's findings — verify-window rows against plain decoding
# (spec_window_check.py), the default model on CUDA (its 32-unit experts now take the reference loop), tiny qwen4exp
# in float32 on CUDA (fla kept out of float32), the fused RMSNorm/RoPE and GDN tests on CUDA, and the A3B-shape decode
# profile again (fused norm/rope). Parts capped; logs come back as one tarball. Carry .whl.
set -uo pipefail
BUDGET=${BUDGET:-540}
source tools/device/parts.sh || exit 1
part tests_cuda 80 python3 -m pytest -q -p no:cacheprovider tests/kernels/pointwise tests/kernels/gdn/test_gated_delta_rule.py
part spec_window 110 python3 tools/device/spec_window_check.py $M
D=strata/data/default-model/strata-default-qwen3next-q8_0.gguf
part spec_default 70 python3 -m strata bench spec $D --device cuda --prompt-tokens 256 --gen-tokens 96
part qwen4exp_tiny 70 python3 tools/device/qwen4exp_check.py $M
part make_a3b 150 python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 -o $M/a3b.gguf
part profile_graphs 90 python3 tools/device/profile_decode.py $M/a3b.gguf --graphs on --steps 8
echo "total ${SECONDS}s"
tar czf "$OUT/logs.tgz" -C $L .
for f in $L/*.log; do echo "=== $f"; grep -v "^\s*$" "$f" | grep -v "^-\{20\}" | tail -n 14 | cut -c1-200; done
