#!/usr/bin/env bash
# On the GPU machine (H200, Triton 3.6), from the repo root; issue 5, the prompt-attention tunables. Three capped parts:
# tests/kernels/attention on CUDA (every variant and blocking against float64 and the fp32 kernel, the imma split
# proof), then `bench prompt-attn --sweep` (v2 and imma over the built-in config list at the five default shapes,
# each beside its default, ranked at the end; lines print as measured), then the parity table (fp32, v2, imma, SDPA)
# with the defaults in the time left.
# Under 7 minutes (BUDGET 400 s); carry .whl (and .devcache). Logs come back as one tarball, the sweep also as
# sweep.txt, compiled kernels as cache.tgz.
set -uo pipefail
BUDGET=${BUDGET:-400}
source tools/device/parts.sh || exit 1
part attention_tests 120 python3 -m pytest -q -p no:cacheprovider --durations=8 tests/kernels/attention
part sweep 250 python3 -m strata.bench.prompt_attn --sweep --variants v2 imma --no-sdpa
part parity 100 python3 -m strata.bench.prompt_attn --variants fp32 v2 imma
echo "total ${SECONDS}s" | tee -a $L/times.txt
save_cache
cp $L/sweep.log "$OUT/sweep.txt"
tar czf "$OUT/logs.tgz" -C $L .
cat $L/times.txt
tail -n 6 $L/attention_tests.log
grep -E "configs by|defaults|^ctx" $L/sweep.log
grep -E "^ctx|PASS|FAIL" $L/parity.log 2>/dev/null | cut -c1-160
