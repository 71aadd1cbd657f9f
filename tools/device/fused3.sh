#!/usr/bin/env bash
# On the GPU machine (issue 6, branch fused3): the fused Q2_0 prompt-expert kernels (`kernels/moe/fused_q2_0.py`).
# 1. the parity table, Q2_0 / Q2_0 at 2,048 and 16,384 tokens (ms of dense / mmq / fused, every bound PASS/FAIL);
# 2. the fused sweep at 16,384 tokens: ms per GATE_UPxWARPSxSTAGES[s]/DOWNxWARPSxSTAGES[s] beside the default, and
#    whether each shape gives the default's bytes;
# 3. the fused-kernel tests on CUDA (compiled kernels against float64, shapes giving the same bytes);
# 4. two native packs at 2,048 tokens through mmq and fused (their Q2_0 down takes the new down kernel).
# Parts capped by tools/device/parts.sh, under 5 minutes in all; carry .whl; one tarball back.
set -uo pipefail
BUDGET=${BUDGET:-285}
source tools/device/parts.sh || exit 1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> $L/gpu.txt 2>&1
part parity_q2_0 75 python3 -m strata.bench.moe_prefill --only "Q2_0 / Q2_0" --tokens 2048,16384
part sweep_fused_16k 110 python3 -m strata.bench.moe_prefill --only "Q2_0 / Q2_0" --tokens 16384 --paths fused \
  --sweep --reps 3
part fused_tests_cuda 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/moe/test_fused_q2_0.py \
  tests/kernels/moe/test_prefill.py --durations=5
part parity_native 35 python3 -m strata.bench.moe_prefill --tokens 2048 --paths mmq,fused \
  --only "IQ2_XS / Q2_0,IQ3_XXS / Q2_0"
echo "total ${SECONDS}s" | tee -a $L/times.txt
tar czf "$OUT/logs.tgz" -C $L .
cat $L/times.txt
for f in $L/*.log; do echo "=== $f"; grep -v "^\s*$" "$f" | tail -n 24 | cut -c1-240; done
