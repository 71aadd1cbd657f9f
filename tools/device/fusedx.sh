#!/usr/bin/env bash
# On the GPU machine (issue 6's kernel goal, branch fusedx): the fused Q2_0 prompt experts with x kept out of shared
# memory (`Tiles` letters, with "h": "t" the decoded weights as the wgmma's register operand of x^T's product, "r"
# the rows' fp16 values loaded straight into that register operand, "a" their int8 codes and scales made those
# values in registers (PTX); "c" at most 128 registers a thread).
# 1. the fused sweep at 16,384 tokens over the new shapes (FUSED_SWEEP's first 12, one line a shape as it is timed,
#    so a cut run keeps what it reached), beside the default "128x32x4x3h/64x4x3h": ms per shape, each shape's
#    gate-up and down kernels timed alone, each within the tool's bounds (its errors on the next line);
# 2. at 2,048 tokens (40 rows an expert: the default is FUSED_Q2_0_SMALL's 64-row "64x8x3h/128x8x3h") the "t" shapes
#    of 64 and 128 rows;
# 3. the fused kernels' CUDA tests (the "a" PTX values bit-equal to rounded_fp16's; "t"/"r"/"a" shapes vs "h");
# 4. Nsight Compute at 16K on the gate-up and down kernels of two new shapes, each its sweep's 9th and 10th launch of
#    them (the default's 8 come first): "128x32x4x3ht/64x4x3ht", the default tile with the weights in registers (to
#    set beside the morning's profile of the default), and "128x64x8x3ht/64x4x3ht" (two 8-warp programs an SM).
# Parts capped by tools/device/parts.sh, under 6 minutes in all; carry .whl (and .devcache).
# Files: summary.txt (the tables), ncu_fusedx.txt, logs.tgz (and the caches).
set -uo pipefail
BUDGET=${BUDGET:-350}
source tools/device/parts.sh || exit 1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> $L/gpu.txt 2>&1
Q="python3 -m strata.bench.moe_prefill --only Q2_0/Q2_0 --paths fused"
SHAPES=$(python3 -c "from strata.bench.moe_prefill import FUSED_SWEEP; print(','.join(FUSED_SWEEP[:12]))")
part sweep_fusedx_16k 130 $Q --tokens 16384 --sweep "$SHAPES" --reps 3
part sweep_fusedx_2k 35 $Q --tokens 2048 --reps 3 \
  --sweep 64x8x3ht/128x8x3ht,64x32x4x3ht/64x4x3ht,128x32x4x3ht/64x4x3ht,128x64x8x3ht/64x4x3ht
part fused_tests_cuda 70 python3 -m pytest -q -p no:cacheprovider tests/kernels/moe/test_fused_q2_0_regs.py \
  tests/kernels/moe/test_fused_q2_0_variants.py tests/kernels/moe/test_fused_q2_0.py --durations=5
NCU="ncu --clock-control none --target-processes all -k regex:_gate_up_q2_0_kernel|_down_q2_0_kernel --launch-skip 8
  --launch-count 2 --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats
  --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats"
part ncu_fusedx_4w 55 $NCU $Q --tokens 16384 --sweep 128x32x4x3ht/64x4x3ht --reps 1
part ncu_fusedx_8w 55 $NCU $Q --tokens 16384 --sweep 128x64x8x3ht/64x4x3ht --reps 1
echo "total ${SECONDS}s" | tee -a $L/times.txt
{ cat $L/times.txt; for f in sweep_fusedx_16k sweep_fusedx_2k; do
    echo "=== $f"; grep -E "^  |^Q2|tokens|PASS|FAIL" $L/$f.log 2>/dev/null | cut -c1-240
  done; } > "$OUT/summary.txt"
cat $L/ncu_fusedx_4w.log $L/ncu_fusedx_8w.log > "$OUT/ncu_fusedx.txt" 2>/dev/null
tar czf "$OUT/logs.tgz" -C $L .
save_cache
cat "$OUT/summary.txt"
echo "=== fused_tests_cuda"; tail -n 12 $L/fused_tests_cuda.log 2>/dev/null | cut -c1-240
echo "=== ncu_fusedx"; grep -E "_kernel|Duration|Throughput|Registers|Achieved Occupancy|Theoretical Occupancy|Issue Slots|Executed Ipc" \
  $L/ncu_fusedx_4w.log $L/ncu_fusedx_8w.log 2>/dev/null | cut -c1-200 | head -120
