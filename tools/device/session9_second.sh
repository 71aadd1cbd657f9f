#!/usr/bin/env bash
# Session 9, second call (one H200): why the streamed prompt's copy and compute add up instead of overlapping
# (issue 6 end to end), and the A3B decode layer's kernels under Nsight Compute (issue 4).
#   timeline_4k / timeline_8k: profile_prompt.py --routing balanced --timeline on 12 full-size layers at 4.4 GiB
#   (the 48-layer file at 12 GiB, in proportion): compute vs copy stream busy, overlap, link idle gaps.
#   ncu_decode: the decode step's kernels (launches past the prompt's).
set -uo pipefail
BUDGET=${BUDGET:-400}
source tools/device/parts.sh || exit 1
[ -f $M/a3b.gguf ] || (python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 -o $M/a3b.tmp.gguf \
   > $L/make_a3b.log 2>&1 && mv $M/a3b.tmp.gguf $M/a3b.gguf) &
make_q4x12
wait
P="python3 tools/device/profile_prompt.py $M/q4x12-00001-of-00002.gguf --vram-budget 4.4 --routing balanced --rows 12"
part timeline_4k 110 $P --tokens 4096 --timeline
part bench_balanced 90 python3 -m strata bench prompt $M/q4x12-00001-of-00002.gguf --vram-budget 4.4 --ctx 4096,16384 \
  --routing balanced
STRATA_NO_GRAPHS=1 part ncu_decode 100 ncu --clock-control none \
  -k "regex:_oneshot_down_kernel|_oneshot_gate_up_kernel|_decode_short_kernel|_add_norm_route_kernel|_qk_norm_rope_store_kernel|_add_rms_norm_kernel" \
  --launch-skip 1000 --launch-count 8 --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
  python3 -m strata bench decode $M/a3b.gguf --device cuda --ctx 4096 --prompt-tokens 8 --tokens 4
finish 40
