#!/usr/bin/env bash
# On the GPU machine (H200, Triton 3.6), from the repo root; issue 5, session 5 (`pattn3`): the int8 prompt attention
# near its floor. Capped parts, lines printed as measured, the most telling first (a session batch may give less):
# 1. sweep at 32K x 1024, imma then v2: first `info probe` lines (the gathers alone, imma without P.V: where the time
#    goes), then each config beside the default with its registers, spills, shared memory and programs per SM:
#    t1 ids resolved before the launch, r register caps, s4/s5 deeper pipelines, p16 imma's P.V in fp16, k split-K,
#    f1 a hand prefetch, c64 bigger chunks, q2 two queries a program;
# 2. the parity table at the five default shapes (fp32, v2, imma, SDPA on bf16), defaults unchanged;
# 3. split-K where programs are few (2.1K x 256: 512 programs for 132 SMs);
# 4. the CUDA tests of the prompt kernels (every new option against float64 and the fp32 kernel, compiled).
# Under 5 minutes (BUDGET 290 s); carry .whl (and .devcache). Files: summary.txt, sweep.txt, logs.tgz.
set -uo pipefail
BUDGET=${BUDGET:-290}
if [[ ":${PYTHONPATH:-}:" == *":/tmp/site:"* ]]; then
  # inside a session batch (tools/device/session*.sh): the wheels are installed and the caches set; installing them
  # again would replace packages under the batch's other queue. Only `part` is needed (as parts.sh defines it).
  part() {
    local name=$1 cap=$2; shift 2
    local left=$((BUDGET - SECONDS)); [ "$left" -lt "$cap" ] && cap=$left
    if [ "$cap" -lt 20 ]; then echo "$name: skipped, out of time" | tee -a "$L/times.txt"; return; fi
    local t0=$SECONDS
    timeout -s USR1 -k 5 "$cap" "$@" > "$L/$name.log" 2>&1
    echo "$name rc=$? in $((SECONDS - t0))s" | tee -a "$L/times.txt"
  }
else
  source tools/device/parts.sh || exit 1
fi
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
L=$OUT/pattn3_logs; mkdir -p $L  # its own logs (a session batch runs this with OUT inside its log folder)
NEW="t1 r128 t1r128 r168 s4 s5t1 p16 t1p16r128 r96 c64t1 q2h0t1 k2 f1"
part sweep 140 python3 -m strata.bench.prompt_attn --ctx 32768 --queries 1024 --variants imma v2 --no-sdpa --sweep $NEW
part parity 85 python3 -m strata.bench.prompt_attn --variants fp32 v2 imma
part sweep_few 30 python3 -m strata.bench.prompt_attn --ctx 2100 --queries 256 --variants imma --no-sdpa \
  --sweep k2 k4 k2t1 k4t1r128
T=tests/kernels/attention
part tests 50 python3 -m pytest -q -p no:cacheprovider $T/test_prompt_split.py $T/test_prompt_blocks.py $T/test_prompt.py \
  $T/test_imma_split.py
echo "total ${SECONDS}s" | tee -a $L/times.txt
cp $L/sweep.log "$OUT/sweep.txt" 2>/dev/null
{
  cat $L/times.txt
  grep -hE "^ctx|PASS|FAIL|best|info|configs by|defaults" $L/parity.log $L/sweep_few.log $L/sweep.log 2>/dev/null \
    | cut -c1-200
  tail -n 2 $L/tests.log 2>/dev/null
  echo "--- key lines (32K x 1024 probes, bests, rankings; 2.1K x 256 best; defaults)"
  grep -hE "info probe|best|configs by" $L/sweep.log 2>/dev/null | cut -c1-400
  grep -hE "best|configs by" $L/sweep_few.log 2>/dev/null | cut -c1-300
  grep -hE "all PASS|some FAIL" $L/parity.log 2>/dev/null
} > "$OUT/summary.txt"
tar czf "$OUT/logs.tgz" -C $L .
rm -rf $L
cat "$OUT/summary.txt"
