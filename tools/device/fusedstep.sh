#!/usr/bin/env bash
# On the GPU machine (issue 4, fewer kernels in a captured decode step): 1) the fused step kernels' tests on CUDA
# (compiled Triton against torch: add + RMSNorm, KV write, shared-expert gate, int32 routing ids, decode attention in
# the activation dtype); 2) captured decode against step-by-step decode on small qwen3moe / qwen3next models
# (decode_graphs_check.py); 3) tools/device/profile_decode.py on the Qwen3-30B-A3B shape (Q4_0, bf16, all resident):
# tok/s, GPU ms per token, kernels per token and the most launched kernels; 4) `strata bench decode` on it.
# Carry .whl (gguf); every part capped (tools/device/parts.sh), the whole under 6 minutes; logs as one tarball.
set -uo pipefail
BUDGET=${BUDGET:-340}
source tools/device/parts.sh || exit 1
part fused_tests 70 python3 -m pytest -q -p no:cacheprovider tests/kernels/pointwise \
  tests/kernels/attention/test_decode.py tests/engine/test_decode_fused.py
part graphs_parity 80 python3 tools/device/decode_graphs_check.py $M 32
[ -f $M/a3b.gguf ] || timeout 120 python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 \
  -o $M/a3b.gguf > $L/make_model.log 2>&1
part profile_a3b 90 python3 tools/device/profile_decode.py $M/a3b.gguf --steps 8 --ctx 4096
part bench_a3b 60 python3 -m strata bench decode $M/a3b.gguf --device cuda --ctx 4096 --tokens 32 --prompt-tokens 32
echo "total ${SECONDS}s"
tar czf "$OUT/logs.tgz" -C $L .
cat $L/times.txt
grep -h "tok/s\|ms per token\|kernels per token" $L/profile_a3b.log
for f in $L/*.log; do echo "=== $f"; grep -v "^\s*$" "$f" | grep -v "^-\{20\}" | head -n 60 | cut -c1-160; done
