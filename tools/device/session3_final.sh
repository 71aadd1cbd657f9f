#!/usr/bin/env bash
# One device call (session 3, last): the word GEMV kernels (gemv.sh's matvec and moe-decode benches, tests on
# CUDA), the A3B-shape decode profile with them, offloaded decode at --vram-budget 12 (the new CPU pool), captured
# decode against step by step and float32 (small qwen3moe and qwen3next), verify windows through graphs (spec.sh,
# small), the layer split as two stages on one card (multigpu.sh), qwen4exp's captured decode (tiny). Parts in priority order, each capped; a part that would start past BUDGET
# seconds is skipped and says so. Carry .whl; logs come back as one tarball.
set -uo pipefail
BUDGET=${BUDGET:-430}
source tools/device/parts.sh || exit 1
part gemv_matvec 60 python3 -m strata bench matvec
part gemv_moe_decode 45 python3 -m strata bench moe-decode --shapes a3b-q4_0,a3b-q4_k --sweep
part gemv_tests 40 python3 -m pytest -q -p no:cacheprovider tests/kernels/moe/test_gemv.py tests/kernels/quant
part make_a3b 85 python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 -o $M/a3b.gguf
part profile_graphs 40 python3 tools/device/profile_decode.py $M/a3b.gguf --graphs on --steps 8
GPUS=$([ "$(nvidia-smi -L | wc -l)" -gt 1 ] && echo 0,1 || echo 0,0)  # two cards when lent, else two stages on one
part multigpu 60 python3 tools/device/multigpu_check.py $M $GPUS
part offload_decode 50 python3 -m strata bench decode $M/a3b.gguf --device cuda --ctx 4096 --tokens 24 \
  --prompt-tokens 32 --vram-budget 12
part graphs_check 50 python3 tools/device/decode_graphs_check.py $M 16
part spec_windows 50 python3 tools/device/spec_windows_check.py $M 16
part qwen4exp_graphs 40 python3 tools/device/qwen4exp_check.py $M graphs
echo "total ${SECONDS}s"
tar czf "$OUT/logs.tgz" -C $L .
cat $L/times.txt
for f in $L/*.log $L/*.txt; do echo "=== $f"; grep -v "^\s*$" "$f" | grep -v "^-\{20\}" | tail -n 8 | cut -c1-180; done
