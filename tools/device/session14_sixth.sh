#!/usr/bin/env bash
# Session 14's sixth call (one H200, ~2 minutes: timeout_s 240; carry .whl and .devcache). Issue 4's open question:
# tools/device/megakernel_probe.py reads an all-resident A3B token's stage bytes as a kernel a stage, as one
# persistent kernel, and as one with a grid-wide barrier after each stage (and with the next stage's first block
# loaded before the barrier): can a persistent decode kernel reach 60 % of the HBM bound?
set -uo pipefail
BUDGET=${BUDGET:-200}
source tools/device/parts.sh || exit 1
part megakernel_probe 150 python3 tools/device/megakernel_probe.py --reps 20 --blocks 2048,4096 --warps 4,8 --per-sm 1,2
finish 80
