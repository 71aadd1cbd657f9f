#!/usr/bin/env bash
# On the GPU machine (H200, Triton 3.6), from the repo root; issue 5, session 8 (`imma3`): imma's two short shapes
# within 2x of the floor, and the long contexts. imma's default is now `q4h4s2t2p16r128x1g1u1a1o1i2z1y4`: prefix
# blocks of 4 queries x 4 heads (queries whose selections are prefixes of their block's last one, the identity below
# 2,051 cells, share its chunks: 16 real rows of 16), the other queries one a program beside them on a second stream
# (session 7's default `s2t2p16r128x1g1u1a1o1`, its bytes), the widest blocks first, splits below 4 programs an SM.
# Every time twice: eager (what a caller sees, host work included: at ~0.3 ms a launch it can be host-bound) and
# replayed from a CUDA graph (`--graph`: the kernels alone), which ranks the sweep's configs.
# 1. the sweep at the five default shapes, the two short ones first: session 7's default (`=bytes` expected at the three long shapes, where no
#    block qualifies), z1, y4 and k4 alone, prefix blocks on one stream (i1) and beside (i2), with the order and the
#    splits rule (y8: 3 splits at 2.1K x 256) or 4 splits; `prefix` lines (how many blocks qualify, the flags'
#    launch), the ranking at the end;
# 2. the long contexts 131,072 x 512 and 524,288 x 256: the parity table (fp32, v2, imma's default, SDPA; the pool's
#    and the selections' size, the peak GPU memory), then imma's default against session 7's there (=bytes at 128K
#    x 512; at 512K x 256, 512 programs, y4 splits each selection in two: ~bytes, within the bounds);
# 3. the CUDA tests of prefix blocks (within the bounds; prefix queries within 1e-5 of the one-query sums, the others
#    its exact bytes; the second stream's bytes = the same stream's), z1 (the same bytes), the splits rule.
# Under 5 minutes (BUDGET 295 s); carry .whl (and .devcache). Files: summary.txt, sweep.txt, logs.tgz (+ caches).
set -uo pipefail
BUDGET=${BUDGET:-295}
source tools/device/parts.sh || exit 1
T=tests/kernels/attention
D=s2t2p16r128x1g1u1a1o1
P="python3 -m strata.bench.prompt_attn"
S="--variants imma --no-sdpa --reps 3 --graph --sweep $D ${D}z1 ${D}y4 ${D}k4 q4h4${D}i1z1 q4h4${D}i2z1 q4h4${D}i2z1y8 \
  q4h4${D}i2z1k4"
part short 120 $P --ctx 1500,2100 --queries 1500,256 $S
part shapes 60 $P --ctx 32768,65536,32768 --queries 1024,512,2048 $S
part long 45 $P --long --variants fp32 v2 imma --reps 3 --graph
part long_rule 30 $P --long --variants imma --no-sdpa --reps 3 --graph --sweep $D
part tests 60 python3 -m pytest -q -p no:cacheprovider -W ignore $T/test_prompt_prefix.py
echo "total ${SECONDS}s" | tee -a $L/times.txt
save_cache
cat $L/short.log $L/shapes.log > "$OUT/sweep.txt" 2>/dev/null
{
  cat $L/times.txt
  tail -n 3 $L/tests.log 2>/dev/null
  echo "--- default shapes"
  grep -hE "^ctx|PASS|FAIL|best|prefix|info|configs by|defaults" $L/short.log $L/shapes.log 2>/dev/null \
    | cut -c1-260
  echo "--- long contexts"
  grep -hE "^ctx|PASS|FAIL|info|best|configs by" $L/long.log $L/long_rule.log 2>/dev/null \
    | cut -c1-230
} > "$OUT/summary.txt"
tar czf "$OUT/logs.tgz" -C $L .
cat "$OUT/summary.txt"
