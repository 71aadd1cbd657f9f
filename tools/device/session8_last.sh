#!/usr/bin/env bash
# Session 8's last call, one H200 (the device minutes left: ~4); carry .whl and .devcache. Issue 5 after branch
# imma3: its CUDA tests (prefix blocks, z1, the splits rule), then imma's new default (prefix blocks of 4 queries x
# 4 heads beside one-query programs, widest first, splits below 4 programs an SM) against session 7's at the five
# default shapes, kernels timed from CUDA graph replays beside eager; then the long contexts 131,072 x 512 and
# 524,288 x 256. Each log is copied into $OUT as soon as its part ends (a call cut by the budget keeps them).
set -uo pipefail
BUDGET=${BUDGET:-200}
source tools/device/parts.sh || exit 1
keep() { cp $L/*.log $L/times.txt "$OUT/" 2>/dev/null; }
D=q1h0c32w4s2t2p16r128x1g1u1a1o1  # session 7's default, and again the default after this call
P="python3 -m strata.bench.prompt_attn"
part tests 45 python3 -m pytest -q -p no:cacheprovider -W ignore tests/kernels/attention/test_prompt_prefix.py; keep
part sweep 110 $P --ctx 1500,2100,32768,65536,32768 --queries 1500,256,1024,512,2048 --variants imma --no-sdpa \
  --reps 5 --graph --sweep $D q4h4${D#q1h0}i1z1y4 ${D}k4; keep
part long 45 $P --long --variants fp32 v2 imma --reps 3 --graph; keep
echo "total ${SECONDS}s" | tee -a $L/times.txt; keep
for f in $L/*.log; do echo "=== $f"; grep -hE "^ctx|PASS|FAIL|best|prefix|configs by|defaults|passed|failed|peak" "$f" \
  | cut -c1-250 | tail -n 45; done
