#!/usr/bin/env bash
# Ready for session 17's first call (one H200, ~5 minutes: timeout_s 400; carry .whl and .ab). Issue 4: the A3B
# step over an int8 KV cache (2.35 ms against 1.83 for fp16 in session 16's sixth call), A against B in one run:
# .ab/head (the package at this commit) against .ab/pervalue (the same with decode_short.py as before d70638f: its
# int8 scales loaded once a value), arms alternating; the fp16 step beside them; the int8 kernel alone (`bench
# decode-attn --kv int8`).
# Make the arms first:
#   rm -rf .ab && for a in head pervalue; do mkdir -p .ab/$a && git archive HEAD strata ':!strata/data' | tar -x -C .ab/$a; done
#   git show d70638f~1:strata/kernels/attention/decode_short.py > .ab/pervalue/strata/kernels/attention/decode_short.py
set -uo pipefail
BUDGET=${BUDGET:-330}
source tools/device/parts.sh || exit 1
A=$A3B
make_a3b_bg && BUDGET=$((BUDGET + 60))
part tests 90 python3 -m pytest -q -p no:cacheprovider tests/kernels/attention/test_decode_short.py
part attn8 50 python3 -m strata bench decode-attn --spans 256,2048 --kv int8
wait_file $A 240
B=$A3B_RESIDENT
ab_rounds 2 35 "head pervalue" $B --kv-dtype int8
part fp16 35 $B
finish 10
