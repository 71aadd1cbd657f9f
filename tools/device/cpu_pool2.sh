#!/usr/bin/env bash
# One device call (session 4, cpupool2): the CPU expert pool's fixed cost per call on the H200 host (16 cores).
# 1. the layer-call / SIMD tests on this CPU (same bytes as the tested path, every ISA variant);
# 2. `bench cpu-experts --calls`: whole pool calls of 1, 3, 10 A3B experts (Q4_0, Q4_K/Q6_K, Q2_0) as decode makes
#    them, beside the bytes' floor, with the fixed cost split out (hand-off, prep, dispatch, regions, native), on 1
#    and 15 threads, the pool's threads sleeping (spin 0) or spinning 1000 us between calls, 300 us apart;
# 3. `bench decode` on the Qwen3-30B-A3B shape (Q4_0) at --vram-budget 12, spin 1000 (the default) and spin 0:
#    tok/s, hit rate, CPU pool MB/token, GB/s and ms a token, the doorbell loop's host time by part, the floor.
# Carry .whl; every part capped (tools/device/parts.sh), under 5 minutes; logs come back as one tarball.
set -uo pipefail
BUDGET=${BUDGET:-295}
source tools/device/parts.sh || exit 1
lscpu | grep -E "^(Model name|CPU\(s\)|L3)" | tee -a "$L/gpu.txt"
part pool_tests 50 python3 -m pytest -q -p no:cacheprovider tests/engine/test_cpu_layer_call.py tests/engine/test_cpu_simd.py
part pool_calls 55 python3 -m strata bench cpu-experts --calls --calls-threads 1,15 --calls-spin 0,1000 \
  --formats Q4_0,Q4_K,Q2_0 --footprint-mb 512 --reps 2
[ -f $M/a3b.gguf ] || part make_a3b 85 python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 \
  -o $M/a3b.gguf
for spin in 1000 0; do
  part decode_spin$spin 55 python3 -m strata bench decode $M/a3b.gguf --device cuda --ctx 4096 --tokens 32 \
    --prompt-tokens 32 --vram-budget 12 --cpu-spin-us $spin
done
echo "total ${SECONDS}s"
tar czf "$OUT/logs.tgz" -C $L .
cat $L/times.txt
echo "=== pool calls"; grep -E "^\||threads|floor" $L/pool_calls.log | cut -c1-200
for f in $L/pool_tests.log $L/decode_spin*.log; do
  echo "=== $f"; grep -E "passed|failed|error|decode |experts |CPU pool|host loop|floor" "$f" | cut -c1-200
done
