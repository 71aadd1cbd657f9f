#!/usr/bin/env bash
# Session 14's sixth call (one H200, ~4 minutes: timeout_s 280; carry .whl and .devcache). Issue 4's open question:
# tools/device/megakernel_probe.py reads an all-resident A3B token's stage bytes as a kernel a stage, as one
# persistent kernel, and as one with a grid-wide barrier after each stage (and with the next stage's first block
# loaded before the barrier): can a persistent decode kernel reach 60 % of the HBM bound? Each form in its own
# process under its own cap (the first try of this call hung in the first persistent form and lost the rest).
set -uo pipefail
BUDGET=${BUDGET:-230}
source tools/device/parts.sh || exit 1
P="python3 tools/device/megakernel_probe.py --reps 20"
part check 40 $P --check
for form in ${FORMS:-launches pdl stream barrier ahead alone}; do
  part $form 35 $P --forms $form --blocks ${BLOCKS:-2048,4096} --warps ${WARPS:-4,8} --per-sm 1,2
done
finish 40
