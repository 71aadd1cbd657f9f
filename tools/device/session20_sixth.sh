#!/usr/bin/env bash
# Session 20's sixth call (one H200, ~4 minutes: timeout_s 300; carry .whl, .ab and .devcache). Issue 4: the greedy
# token in one launch (kernels/sample/argmax.py, `Sampler.pick`'s argmax on a GPU: torch's reduction took ~8 us of
# the step's 24 outside the layers, call 5). Arms alternating (A3B all resident, fp16 KV):
#   base    .ab/base (HEAD's package: the step's inputs in one launch each, 1.72 ms in call 5)
#   argmax  .ab/argmax (the working tree's package)
# Make the arms as session20_fifth.sh's. First the kernel's CUDA tests (torch.argmax's index in every case).
set -uo pipefail
BUDGET=${BUDGET:-260}
source tools/device/parts.sh || exit 1
make_a3b_bg && BUDGET=$((BUDGET + 40))
part tests_argmax 40 python3 -m pytest -q -p no:cacheprovider tests/kernels/sample/test_argmax.py
wait_file $A3B 200
ab_rounds 2 30 "base argmax" $A3B_RESIDENT
finish 6
