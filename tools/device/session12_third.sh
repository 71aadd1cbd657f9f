#!/usr/bin/env bash
# Session 12's third call (one H200, ~9 minutes: timeout_s 600; carry .whl and .devcache). Issue 6's 4K prompt: the
# second call's probe spent ~150 ms more at a prompt's end when its ids were new (a hybrid model's cache checkpointed
# into fresh pinned memory, ~150 allocations) than when the same prompt came again. Here: pinned_probe.py (what the
# allocations cost, per tensor against HostCopies' slabs, and with torch's host-register threads), then issue 6's
# command (dma, the default) with the slabs, printing each prompt's checkpoint time; then the same command with
# PYTORCH_CUDA_ALLOC_CONF=pinned_use_cuda_host_register:True,pinned_num_register_threads:8.
set -uo pipefail
BUDGET=${BUDGET:-560}
source tools/device/parts.sh || exit 1
make_full_bg; F=$FULL
wait_file $FULL_MADE 260
part pinned 60 python3 tools/device/pinned_probe.py
P="python3 -m strata bench prompt $F --device cuda --vram-budget 12 --ctx 4096,32768 --routing balanced --reps 2"
part prompt_dma 100 $P
PYTORCH_CUDA_ALLOC_CONF=pinned_use_cuda_host_register:True,pinned_num_register_threads:8 part prompt_dma_reg 100 $P
finish 40
