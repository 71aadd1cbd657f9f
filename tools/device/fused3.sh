#!/usr/bin/env bash
# On the GPU machine (issue 6, branch fused3): the fused Q2_0 prompt-expert kernels (`kernels/moe/fused_q2_0.py`).
# 1. the parity table, Q2_0 / Q2_0 at 2,048 and 16,384 tokens (ms of dense / mmq / fused, every bound PASS/FAIL);
# 2. the fused sweep at 16,384 tokens: ms per GATE_UPxWARPSxSTAGES[s]/DOWNxWARPSxSTAGES[s] beside the default, and
#    whether each shape gives the default's bytes;
# 3. the fused-kernel tests on CUDA (compiled kernels against float64, shapes giving the same bytes);
# 4. two native packs at 2,048 tokens through mmq and fused (their Q2_0 down takes the new down kernel).
# Parts capped by tools/device/parts.sh (nested in a session batch: its setup, logs in $OUT/logs), under 5 minutes in
# all, the most telling first; carry .whl (and .devcache). Files: summary.txt (the tables), logs.tgz.
set -uo pipefail
BUDGET=${BUDGET:-285}
source tools/device/parts.sh || exit 1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> $L/gpu.txt 2>&1
part parity_q2_0 90 python3 -m strata.bench.moe_prefill --only "Q2_0 / Q2_0" --tokens 2048,16384
part sweep_fused_16k 100 python3 -m strata.bench.moe_prefill --only "Q2_0 / Q2_0" --tokens 16384 --paths fused \
  --sweep --reps 3
part fused_tests_cuda 50 python3 -m pytest -q -p no:cacheprovider tests/kernels/moe/test_fused_q2_0.py \
  tests/kernels/moe/test_prefill.py --durations=5
part parity_native 30 python3 -m strata.bench.moe_prefill --tokens 2048 --paths mmq,fused \
  --only "IQ2_XS / Q2_0,IQ3_XXS / Q2_0"
echo "total ${SECONDS}s" | tee -a $L/times.txt
# The sweep prints a path's shapes on one line (" | " between them): one a line here.
{ cat $L/times.txt; for f in parity_q2_0 sweep_fused_16k parity_native; do
    echo "=== $f"; grep -E "^  |^Q2|^IQ|tokens|PASS|FAIL" $L/$f.log 2>/dev/null | sed 's/ | /\n      /g' | cut -c1-240
  done; } > "$OUT/summary.txt"
tar czf "$OUT/logs.tgz" -C $L .
cat "$OUT/summary.txt"
echo "=== fused_tests_cuda"; tail -n 12 $L/fused_tests_cuda.log 2>/dev/null | cut -c1-240
