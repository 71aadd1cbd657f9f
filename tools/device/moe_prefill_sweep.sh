#!/usr/bin/env bash
# On the GPU machine (issue 6, prompt experts): the MoE prompt-kernel tests on CUDA (compiled kernels against float64
# at small shapes, launch shapes giving the same bytes), the parity tool at full shape (Q2_0 / Q2_0 at 2048 and
# 16384 tokens, the native packs at 2048), then the launch-shape sweeps (`--sweep`: ms per BNxWARPSxSTAGES for each
# path beside its default). Parts capped by tools/device/parts.sh, under 7 minutes; carry .whl; one tarball back.
set -uo pipefail
BUDGET=${BUDGET:-400}
source tools/device/parts.sh || exit 1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> $L/gpu.txt 2>&1
part moe_tests_cuda 130 python3 -m pytest -q -p no:cacheprovider tests/kernels/moe/test_prefill.py \
  tests/kernels/moe/test_prefill_slots.py tests/kernels/moe/test_grouping.py tests/kernels/moe/test_quantize32.py \
  tests/kernels/moe/test_decode.py --durations=5
part parity_q2_0 90 python3 -m strata.bench.moe_prefill --only "Q2_0 / Q2_0" --tokens 2048,16384
part sweep_q2_0_16k 100 python3 -m strata.bench.moe_prefill --only "Q2_0 / Q2_0" --tokens 16384 --sweep --reps 3
part parity_native 60 python3 -m strata.bench.moe_prefill --tokens 2048 --paths mmq,fused \
  --only "IQ2_XS / Q2_0,IQ3_XXS / Q2_0,IQ3_S / Q2_0,IQ4_XS / IQ4_NL,Q4_K / Q2_0"
part sweep_iq2_xs_8k 40 python3 -m strata.bench.moe_prefill --only "IQ2_XS / Q2_0" --tokens 8192 --paths mmq,fused \
  --sweep 64x8x2,64x8x3,32x8x3,128x8x2,64x4x2 --reps 3
echo "total ${SECONDS}s" | tee -a $L/times.txt
tar czf "$OUT/logs.tgz" -C $L .
cat $L/times.txt
for f in $L/*.log; do echo "=== $f"; grep -v "^\s*$" "$f" | tail -n 16 | cut -c1-220; done
