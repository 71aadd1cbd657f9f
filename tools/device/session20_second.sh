#!/usr/bin/env bash
# Session 20's second call (one H200, ~7 minutes: timeout_s 480; carry .whl, .ab and .devcache). Issue 4, after the
# first call's Nsight Compute pass: the routing launch's last program spends its time in dependent reductions (the
# top-k's 8 passes of a float max by shuffles), and the experts' float gate/up runs in 1.45 waves (768 programs of
# 118 registers: 4 an SM). Arms, alternating round by round (A3B all resident, fp16 KV):
#   base   .ab/base (HEAD's package)
#   topk   .ab/topk (route_topk.py: the passes' max and the softmax's max over int32 bits: REDUX, no shuffles)
#   r80    .ab/base + the gate/up launch at maxnreg=80 (6 programs an SM: one wave; 88 bytes spilled)
#   t16    .ab/base + gate/up tiles of 16 rows x 8 warps at maxnreg=80 (384 programs, 3 an SM: one wave)
# Make the arms:
#   rm -rf .ab && mkdir -p .ab/{base,topk,r80,t16} && git archive 2eb4252 strata ':!strata/data' | tar -x -C .ab/base
#   for a in topk r80 t16; do cp -r .ab/base/strata .ab/$a/; done; cp strata/kernels/pointwise/route_topk.py .ab/topk/...
#   r80, t16: `maxnreg=80,` in launch_oneshot_gate_up's launch; t16: MEASURED_TILES gate_up Q4_0 bn=16, warps=8
# then the routing's CUDA tests and its increments, both on the working tree (= topk).
set -uo pipefail
BUDGET=${BUDGET:-420}
source tools/device/parts.sh || exit 1
make_a3b_bg && BUDGET=$((BUDGET + 60))
part tests_route 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/pointwise/test_rms_norm_rope.py \
  tests/kernels/pointwise/test_add_norm_route.py -k "route"
wait_file $A3B 240
ab_rounds 2 30 "base topk r80 t16" $A3B_RESIDENT
part inc_topk 40 python3 tools/device/profile_decode.py $A3B --steps 8 --vram-budget 24 --increments
finish 8
