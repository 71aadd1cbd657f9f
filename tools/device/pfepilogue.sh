#!/usr/bin/env bash
# On the GPU machine (issue 6, branch pfepilogue): the fused Q2_0 prompt experts' variants (`Tiles` letters "m": MMA
# started from a float's bits instead of int-to-float conversions, same bytes; "h": fp16 MMAs on exactly decoded
# weights, no per-step epilogue, within the bounds).
# 1. the parity table, Q2_0 / Q2_0 at 16,384 tokens through mmq and the default fused (the 1.5x goal's baseline);
# 2. the fused sweep at 2,048 and 16,384 tokens (`FUSED_SWEEP`): ms per shape beside the default; the "m" shapes
#    must give the default's bytes, the "h" shapes pass the bounds (each prints its errors);
# 3. the fused-kernel tests on CUDA (the variants against float64 and the default, the fp16 decoder exact).
# Parts capped by tools/device/parts.sh, under 4 minutes in all; carry .whl (and .devcache).
# Files: summary.txt (the tables, one shape a line), logs.tgz.
set -uo pipefail
BUDGET=${BUDGET:-235}
source tools/device/parts.sh || exit 1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> $L/gpu.txt 2>&1
part parity_q2_0_16k 40 python3 -m strata.bench.moe_prefill --only "Q2_0 / Q2_0" --tokens 16384 --paths mmq,fused
part sweep_fused 150 python3 -m strata.bench.moe_prefill --only "Q2_0 / Q2_0" --tokens 2048,16384 --paths fused \
  --sweep --reps 3
part fused_tests_cuda 40 python3 -m pytest -q -p no:cacheprovider tests/kernels/moe/test_fused_q2_0_variants.py \
  tests/kernels/moe/test_fused_q2_0.py --durations=5
echo "total ${SECONDS}s" | tee -a $L/times.txt
# The sweep prints a path's shapes on one line (" | " between them): one a line here.
{ cat $L/times.txt; for f in parity_q2_0_16k sweep_fused; do
    echo "=== $f"; grep -E "^  |^Q2|tokens|PASS|FAIL" $L/$f.log 2>/dev/null | sed 's/ | /\n      /g' | cut -c1-240
  done; } > "$OUT/summary.txt"
tar czf "$OUT/logs.tgz" -C $L .
save_cache
cat "$OUT/summary.txt"
echo "=== fused_tests_cuda"; tail -n 12 $L/fused_tests_cuda.log 2>/dev/null | cut -c1-240
