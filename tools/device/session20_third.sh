#!/usr/bin/env bash
# Session 20's third call (one H200, ~6 minutes: timeout_s 420; carry .whl, .ab and .devcache). Issue 4: the decode
# attention's first chunk loaded beside the width (decode_short.py EARLY: over a dense fp16 / bf16 cache, up to
# CELLS x MAX_SPLITS cells a program's share is the chunk at split x CELLS whatever the width, so its keys and
# values need not wait for the width's load). Arms, alternating (A3B all resident, fp16 KV):
#   base    .ab/base  (HEAD: the routing's top-k over int32 bits, 1.74 ms in call 2)
#   early   .ab/early (the working tree's decode_short.py)
# Make the arms: rm -rf .ab && mkdir -p .ab/{base,early} && git archive HEAD strata ':!strata/data' | tar -x -C
#   .ab/base && cp -r .ab/base/strata .ab/early/ && cp strata/kernels/attention/decode_short.py .ab/early/strata/...
# then the kernel's CUDA tests (the early chunk's bytes against the loop's) and greedy tokens against split-K.
set -uo pipefail
BUDGET=${BUDGET:-360}
source tools/device/parts.sh || exit 1
make_a3b_bg && BUDGET=$((BUDGET + 60))
part tests_attn 90 python3 -m pytest -q -p no:cacheprovider tests/kernels/attention/test_decode_short.py
wait_file $A3B 240
ab_rounds 3 30 "base early" $A3B_RESIDENT
part tokens_attn 60 python3 tools/device/attn_tokens_check.py $A3B --only attn --tokens 24 --prompts 300
part inc_early 40 python3 tools/device/profile_decode.py $A3B --steps 8 --vram-budget 24 --increments
finish 8
