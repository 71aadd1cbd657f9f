#!/usr/bin/env bash
# On the GPU machine (H200, Triton 3.6), from the repo root; issue 5, session 6 (`immapv`): imma toward 1.3x v2.
# Capped parts, lines printed as measured, the most telling first:
# 1. the sweep at 32K x 1024, v2 (4 configs) then imma (the built-in list: x1/x2 exact conversions, t2 KV head 0's
#    rows with int32 offsets (the same bytes), g1 per-group scores, d2 P.V in halves, with register caps, stages,
#    chunks; `info probe` lines for the default and t2p16r128x1g1d2), each beside its default: PASS/FAIL, registers,
#    spills, shared memory, programs per SM;
# 2. the CUDA tests of the new options (x1 codes to fp16 through their bits, t2: the same bytes; g1 imma's scores as a
#    2D dot per 64-dim group: within the bounds), compiled;
# 3. the leading candidates at the five default shapes (the ranking at the end is over all of them).
# In a batch with less BUDGET the sweep takes it all (v2's few lines first, then imma's, its likeliest first).
# Under 4 minutes (BUDGET 230 s); carry .whl (and .devcache). Files: summary.txt, sweep.txt, logs.tgz.
set -uo pipefail
BUDGET=${BUDGET:-230}
source tools/device/parts.sh || exit 1
T=tests/kernels/attention
part sweep 120 python3 -m strata.bench.prompt_attn --ctx 32768 --queries 1024 --variants v2 imma --no-sdpa --sweep
part tests 50 python3 -m pytest -q -p no:cacheprovider -W ignore $T/test_prompt_imma_cells.py $T/test_imma_split.py
part shapes 55 python3 -m strata.bench.prompt_attn --variants imma v2 --no-sdpa --reps 3 \
  --sweep t2r128x1 t2p16r128x1g1d2 t2p16x1g1d2 t2p16r96x1g1d2
echo "total ${SECONDS}s" | tee -a $L/times.txt
save_cache
cp $L/sweep.log "$OUT/sweep.txt" 2>/dev/null
{  # the 32K x 1024 sweep last: a batch prints the tail of this file
  cat $L/times.txt
  tail -n 3 $L/tests.log 2>/dev/null
  echo "--- default shapes"
  grep -hE "^ctx|best|configs by|defaults|FAIL" $L/shapes.log 2>/dev/null | cut -c1-400
  echo "--- 32K x 1024"
  grep -hE "^ctx|PASS|FAIL|best|info|configs by|defaults" $L/sweep.log 2>/dev/null | cut -c1-220
} > "$OUT/summary.txt"
tar czf "$OUT/logs.tgz" -C $L .
cat "$OUT/summary.txt"
