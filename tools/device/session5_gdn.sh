#!/usr/bin/env bash
# A last short device call (session 5): the GatedDeltaNet decode kernels (gdnstep) on the GPU before they stay
# default: their CUDA tests on card 0, and captured decode against step by step on qwen3next (card 0) and qwen4exp
# (card 1). Carry .whl and .devcache.
set -uo pipefail
BUDGET=${BUDGET:-85}
source tools/device/parts.sh || exit 1
(export CUDA_VISIBLE_DEVICES=0
 part gdn_tests 30 python3 -m pytest -q -p no:cacheprovider tests/kernels/pointwise/test_gdn_step_kernels.py
 part graphs_next 50 python3 tools/device/decode_graphs_check.py $M 16 qwen3next) &
(export CUDA_VISIBLE_DEVICES=1
 part graphs_qwen4exp 80 python3 tools/device/qwen4exp_check.py $M graphs) &
wait
cat $L/times.txt
for f in $L/*.log; do echo "=== $f"; grep -v "^\s*$" "$f" | tail -n 12 | cut -c1-200; done
