#!/usr/bin/env bash
# On the GPU machine (H200, Triton 3.6), from the repo root; issue 5, session 5 (`pattn3`): the int8 prompt attention
# near its floor. Four capped parts, lines printed as measured:
# 1. parity: the table at the five default shapes (fp32, v2, imma, SDPA on bf16), defaults unchanged;
# 2. sweep at 32K x 1024 (v2 and imma; each line with registers, spills, smem, programs/SM): the new tunables beside
#    each default (t1 ids resolved before the launch, s4/s5 deeper pipelines, k split-K, p16 imma's P.V in fp16,
#    r register caps for more programs per SM, f1 a hand prefetch), then `info probe` lines: the gathers alone and
#    imma without P.V, which say where the time goes;
# 3. split-K where programs are few (2.1K x 256: 512 programs for 132 SMs);
# 4. the CUDA tests of the prompt kernels (every new option against float64 and the fp32 kernel, compiled).
# Under 5 minutes (BUDGET 290 s); carry .whl (and .devcache). Logs as one tarball, the sweep also as sweep.txt.
set -uo pipefail
BUDGET=${BUDGET:-290}
source tools/device/parts.sh || exit 1
NEW="t1 s4 r128 t1r128 s5t1 p16 t1p16 t1p16r128 s4r128 r96 k2 c64t1 q2h0t1 f1"
part parity 85 python3 -m strata.bench.prompt_attn --variants fp32 v2 imma
part sweep 145 python3 -m strata.bench.prompt_attn --ctx 32768 --queries 1024 --variants v2 imma --no-sdpa --sweep $NEW
part sweep_few 30 python3 -m strata.bench.prompt_attn --ctx 2100 --queries 256 --variants imma --no-sdpa \
  --sweep k2 k4 k2t1 k4t1r128
part tests 50 python3 -m pytest -q -p no:cacheprovider tests/kernels/attention/test_prompt_split.py \
  tests/kernels/attention/test_prompt_blocks.py tests/kernels/attention/test_prompt.py
echo "total ${SECONDS}s" | tee -a $L/times.txt
save_cache
cp $L/sweep.log "$OUT/sweep.txt"
tar czf "$OUT/logs.tgz" -C $L .
cat $L/times.txt
grep -E "^ctx|PASS|FAIL|info" $L/parity.log 2>/dev/null | cut -c1-170
grep -E "^ctx|PASS|FAIL|best|info|configs by|defaults" $L/sweep.log $L/sweep_few.log 2>/dev/null | cut -c1-170
tail -n 4 $L/tests.log
