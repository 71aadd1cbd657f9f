#!/usr/bin/env bash
# Session 9, first call (one H200): where the two open goals lose their time, before building on guesses.
#   link_overlap: a layer's expert stream (gather kernel vs copy engines) alone and beside GEMMs (issue 6 end to end).
#   ncu_fused: Nsight Compute on the fused prompt-expert kernels at 16K tokens (issue 6's 2.5x int8 floor).
#   ncu_decode: Nsight Compute on the A3B decode layer's eight kernels (issue 4's 60 % of the HBM bound).
set -uo pipefail
BUDGET=${BUDGET:-470}
source tools/device/parts.sh || exit 1
(python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 -o $M/a3b.tmp.gguf \
   > $L/make_a3b.log 2>&1 && mv $M/a3b.tmp.gguf $M/a3b.gguf) &
which ncu > $L/ncu_version.log 2>&1; ncu --version >> $L/ncu_version.log 2>&1
part link_overlap 100 python3 tools/device/link_overlap.py
NCU="ncu --clock-control none --target-processes all"
part ncu_fused 150 $NCU -k "regex:_gate_up_q2_0_kernel|_down_q2_0_kernel" --launch-count 2 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section MemoryWorkloadAnalysis \
  --section Occupancy --section LaunchStats \
  python3 -m strata bench moe-prefill --only "Q2_0 / Q2_0" --tokens 16384 --paths fused --reps 1
while [ ! -f $M/a3b.gguf ] && [ $SECONDS -lt 300 ]; do sleep 2; done
STRATA_NO_GRAPHS=1 part ncu_decode 130 $NCU \
  -k "regex:_oneshot_down_kernel|_oneshot_gate_up_kernel|_decode_short_kernel|_add_norm_route_kernel|_qk_norm_rope_store_kernel|_add_rms_norm_kernel" \
  --launch-skip 8 --launch-count 16 --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
  python3 -m strata bench decode $M/a3b.gguf --device cuda --ctx 4096 --prompt-tokens 8 --tokens 3
finish 60
