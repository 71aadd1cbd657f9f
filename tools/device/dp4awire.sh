#!/usr/bin/env bash
# On the GPU machine (H200, Triton 3.6), from the repo root; issue 4: the decode step with STRATA_DP4A (models/
# dp4a_step.py: the Q4_0 q/k/v, o and resident experts through the dp4a GEMVs, the norms writing the codes) against
# unset, all resident on the A3B shape. In order:
# 1. (the A3B file made in the background if absent, ~90 s) the wiring's kernel tests compiled on CUDA: the norm
#    launches' codes equal quantize_x's bytes (no FMA contraction), the dp4a GEMVs launched with PDL the same bytes;
# 2. `bench decode` unset, then in a process started with STRATA_DP4A=1: tok/s, the GPU step, the HBM floor line
#    (session 10: 1.95 ms GPU step, 21.8 % of the bound): whether the step gains;
# 3. dp4awire_check.py: greedy tokens (32, after a 32-token prompt) and logits, DP4A against unset in one process,
#    both captured: tokens equal N/32, the logits' largest difference in units of the largest logit (bound 0.05),
#    the dp4a launches counted (PASS/FAIL).
# Under 5 minutes with a3b.gguf present (BUDGET 280 s; ~6 without, the tests running while it is made); logs in
# $OUT (dp4awire_logs.tgz, the compile caches when run alone). Carry .whl (and .devcache). Batch line:
#   script dp4awire 300
set -uo pipefail
BUDGET=${BUDGET:-280}
source tools/device/parts.sh || exit 1
A=$M/a3b.gguf
make_a3b_bg && BUDGET=$((BUDGET + 90))
part tests 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/pointwise/test_norm_codes.py \
  tests/kernels/moe/test_dp4a_pdl.py
wait_file $A $((BUDGET - 200))
B="python3 -m strata bench decode $A --device cuda --ctx 4096 --prompt-tokens 32 --tokens 64"
part bench_unset 65 $B
part bench_dp4a 65 env STRATA_DP4A=1 $B
part check_a3b 80 python3 tools/device/dp4awire_check.py $A --tokens 32 --prompt-tokens 32
summarize dp4awire "passed|failed|Error|rc=|tok/s|GPU step|floor|bound|captured|PASS|FAIL"
