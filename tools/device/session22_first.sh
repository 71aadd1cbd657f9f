#!/usr/bin/env bash
# Session 22's first call (one H200, ~9 minutes: timeout_s 590; carry .whl). What was left unchecked on the GPU:
# the argmax kernel's last reduction as first_max over (keys, firsts) (ba82e9e, interpreter-tested only), the step's
# input kernels (RoPE cos/sin rows, embedding rows) against torch, the engine's CUDA path against transformers
# (check_cuda.py: the RoPE rows inside a whole forward pass); then issue 4's figures at HEAD (A3B Q4_0: all resident,
# the issue's own command at 12 GiB and its every-expert-on-the-CPU baseline), and the whole CUDA kernel suite last.
set -uo pipefail
BUDGET=${BUDGET:-560}
source tools/device/parts.sh || exit 1
make_a3b_bg && BUDGET=$((BUDGET + 0))
part tests_first 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/sample tests/kernels/pointwise/test_step_inputs.py
part check_cuda 120 python3 tools/device/check_cuda.py
wait_file $A3B 260
part resident 70 $A3B_RESIDENT
part budget12 90 python3 -m strata bench decode $A3B --device cuda --vram-budget 12 --ctx 4096 --tokens 256
part cache0 90 python3 -m strata bench decode $A3B --device cuda --vram-budget 12 --ctx 4096 --tokens 64 --expert-cache 0
part tests_kernels 200 python3 -m pytest -q -x -p no:cacheprovider tests/kernels
finish 14
