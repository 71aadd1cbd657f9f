#!/usr/bin/env bash
# Ready for session 13's first call (one H200, ~9 minutes: timeout_s 590; carry .whl and .devcache). Issue 6, with the
# engine's pinning from threads (engine/pinned_memory.py, e81eb0d) measured only in a second process so far (4K
# 1.38x, 32K 1.24x the PCIe floor): issue 6's command by dma (the default) in the first process on a freshly made
# file (the slowest in every earlier call: cold n-gram rows) and in a second one, then a 4K prompt layer by layer on
# new ids and again (chunk_probe.py: where the first layers' ~40-70 ms go); the prompt experts' parity table at 2K and
# 16K (the fused path against the int8 floor, goal 2.5x) runs while the full file is made.
set -uo pipefail
BUDGET=${BUDGET:-540}
source tools/device/parts.sh || exit 1
make_full_bg; F=$FULL
part moe_prefill 90 python3 -m strata bench moe-prefill --only "Q2_0 / Q2_0" --tokens 2048,16384 --paths mmq,fused
wait_file $FULL_MADE 260
P="python3 -m strata bench prompt $F --device cuda --vram-budget 12 --ctx 4096,32768 --routing balanced --reps 2"
part prompt_first 100 $P
part prompt_second 100 $P
part probe_4k 70 python3 tools/device/chunk_probe.py $F --tokens 4096 --vram-budget 12 --forms dma --per-layer --seed 11
finish 40
