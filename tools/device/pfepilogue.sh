#!/usr/bin/env bash
# On the GPU machine (issue 6, branch pfepilogue): the fused Q2_0 prompt experts' variants (`Tiles` letters "m": MMA
# started from a float's bits instead of int-to-float conversions, same bytes; "h": fp16 MMAs on exactly decoded
# weights, no per-step epilogue, within the bounds; "w": two blocks a step).
# 1. the fused sweep at 16,384 tokens (`FUSED_SWEEP`, likeliest first, one line a shape as it is timed, so a cut run
#    keeps what it reached): ms per shape beside the default, each shape's gate-up and down kernels timed alone; the
#    "m" shapes must give the default's bytes, the "h" shapes pass the bounds (their errors on the next line);
# 2. the parity table, Q2_0 / Q2_0 at 16,384 tokens through mmq and the default fused (the 1.5x goal's baseline);
# 3. the same sweep at 2,048 tokens;
# 4. the fused-kernel tests on CUDA (the variants against float64 and the default, the fp16 decoder exact).
# Parts capped by tools/device/parts.sh, under 4 minutes in all (the most telling first); carry .whl (and .devcache).
# Files: summary.txt (the tables), logs.tgz.
set -uo pipefail
BUDGET=${BUDGET:-235}
source tools/device/parts.sh || exit 1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> $L/gpu.txt 2>&1
Q="python3 -m strata.bench.moe_prefill --only Q2_0/Q2_0"
part sweep_fused_16k 110 $Q --tokens 16384 --paths fused --sweep --reps 3
part parity_q2_0_16k 40 $Q --tokens 16384 --paths mmq,fused
part sweep_fused_2k 45 $Q --tokens 2048 --paths fused --sweep --reps 3
part fused_tests_cuda 40 python3 -m pytest -q -p no:cacheprovider tests/kernels/moe/test_fused_q2_0_variants.py \
  tests/kernels/moe/test_fused_q2_0.py --durations=5
echo "total ${SECONDS}s" | tee -a $L/times.txt
{ cat $L/times.txt; for f in sweep_fused_16k parity_q2_0_16k sweep_fused_2k; do
    echo "=== $f"; grep -E "^  |^Q2|tokens|PASS|FAIL" $L/$f.log 2>/dev/null | cut -c1-240
  done; } > "$OUT/summary.txt"
tar czf "$OUT/logs.tgz" -C $L .
save_cache
cat "$OUT/summary.txt"
echo "=== fused_tests_cuda"; tail -n 12 $L/fused_tests_cuda.log 2>/dev/null | cut -c1-240
