#!/usr/bin/env bash
# Session 10: the streamed prompt with the gather kernel on fewer SMs (STRATA_PF_GATHER), copies against compute.
# Why: the dump showed cuBLAS's sm90 GEMMs not starting while the 132-program gather (one a SM) runs.
set -uo pipefail
BUDGET=${BUDGET:-240}
source tools/device/parts.sh || exit 1
L=$OUT
make_q4x12
S="python3 tools/device/stream_split.py $M/q4x12-00001-of-00002.gguf --tokens 4096 --vram-budget 7 --reps 2 --rows 0"
for g in ${GATHERS:-p32b2048w4 p16b4096w4}; do
  STRATA_PF_GATHER=$g part split_$g 60 $S
done
finish 12
