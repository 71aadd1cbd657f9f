#!/usr/bin/env bash
# Session 18's second call (one H200, ~9 minutes: BUDGET=460, timeout_s 580; the same arms as session18_first.sh,
# carried again). Issue 4, the int8 KV cache (the product's): after a 64-token prompt, .ab/head against .ab/novh
# (the value row loaded after the key's store), .ab/tf (the int8 cache's dots tf32x3 over codes scaled in fp32, as
# before 45e4a9a) and .ab/head under STRATA_DECODE_TURN (54ca441: the quantized store inside the attention's launch;
# its CUDA tests first) and .ab/g2 (tools/device/session18_int8_groups.patch: at D 128 the QK as two 2-D dots, one
# a 64-value group, instead of a batched dot and a sum over the groups: in the sm_90 build 2,576 -> 2,232
# instructions, shared-memory loads 100 -> 69, stores 65 -> 22, 238 -> 228 registers; its CUDA tests first); after
# a 1,200-token prompt (span 2048, 16 programs a KV head) head against tf; the int8 step's increments.
# The g2 arm, beside session18_first.sh's arms (which this call carries again):
#   mkdir -p .ab/g2 && git archive HEAD strata tests ':!strata/data' | tar -x -C .ab/g2
#   patch -d .ab/g2 -p1 < tools/device/session18_int8_groups.patch
set -uo pipefail
BUDGET=${BUDGET:-380}
source tools/device/parts.sh || exit 1
make_a3b_bg && BUDGET=$((BUDGET + 60))
part tests 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/attention/test_decode_short.py -k "turn"
part tests_g2 60 env -C .ab/g2 python3 -m pytest -q -p no:cacheprovider tests/kernels/attention/test_decode_short.py \
  -k "int8"
wait_file $A3B 240
for round in 1 2; do
  for arm in head novh tf g2; do part ${arm}_$round 30 env -C .ab/$arm $A3B_RESIDENT --kv-dtype int8; done
  part turn_$round 30 env -C .ab/head STRATA_DECODE_TURN=1 $A3B_RESIDENT --kv-dtype int8
done
for arm in head tf; do  # (ab_rounds would log these as head_1, tf_1 again)
  part ${arm}_span2048 35 env -C .ab/$arm $A3B_RESIDENT --kv-dtype int8 --prompt-tokens 1200
done
part inc_int8 40 python3 tools/device/profile_decode.py $A3B --steps 8 --vram-budget 24 --increments --kv-dtype int8
Q=$(mktemp -d /tmp/s18-q4.XXXX)  # the first call's cap (60 s) cut it while compiling: again, its caches warmer
part graphs_qwen4exp 100 python3 tools/device/qwen4exp_check.py $Q graphs
finish 14
