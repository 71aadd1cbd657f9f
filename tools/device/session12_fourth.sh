#!/usr/bin/env bash
# Session 12's fourth call (one H200, ~4 minutes: timeout_s 250; carry .whl and .devcache): the engine now sets torch's
# pinned_use_cuda_host_register itself (engine/pinned_memory.py). On the 12-layer full-size qwen4exp at 7 GiB, a 4K
# prompt by the engine as it is (first, on the colder page cache), then with the user's override
# PYTORCH_CUDA_ALLOC_CONF=pinned_use_cuda_host_register:False (the allocation before this session); each prints its
# checkpoint time a prompt, and each part's time includes the load (the expert store is pinned there too).
set -uo pipefail
BUDGET=${BUDGET:-230}
source tools/device/parts.sh || exit 1
make_q4x12; F=$M/q4x12-00001-of-00002.gguf
P="python3 -m strata bench prompt $F --device cuda --vram-budget 7 --ctx 4096 --routing balanced --reps 2"
part prompt_engine 70 $P
PYTORCH_CUDA_ALLOC_CONF=pinned_use_cuda_host_register:False part prompt_before 70 $P
finish 12
