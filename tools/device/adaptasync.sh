#!/usr/bin/env bash
# Issue 4, decode without host stalls (branch adaptasync), one H200, under 4 minutes. While the A3B-shape file
# (qwen3moe, Q4_0) is written: adaptasync_check.py on a small model (captured direct-miss decode adapting every
# step: no readout waited for, exact hit counts, the same bytes twice). Then `strata bench decode` on the A3B shape:
# --vram-budget 24 (every expert fits: the resident run; its "GPU step", the device time of a step without the host
# loop, is the floor's GPU time a token, passed on as --gpu-floor MS), then 12 and 16 GiB with direct misses, each
# after (the default) and before (STRATA_ADAPT_SYNC=1: counts read with a host wait at the step that ends an adapt
# period, swaps at once), the all-CPU baseline (--expert-cache 0) and --misses cpu at 12; at 12 GiB also the sweep of
# adapt_every x adapt_swaps on the loaded engine. Carry .whl and .devcache.
set -uo pipefail
BUDGET=${BUDGET:-235}
source tools/device/parts.sh || exit 1
if [ ! -f $M/a3b.gguf ] && [ ! -f $M/a3b.tmp.gguf ]; then  # (a session batch may have written it, or be writing it)
  (python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 -o $M/a3b.tmp.gguf \
    > $L/make_a3b.log 2>&1 && mv $M/a3b.tmp.gguf $M/a3b.gguf) &
fi
part check 60 python3 tools/device/adaptasync_check.py $M 48
wait_file $M/a3b.gguf $((BUDGET - 60))
echo "a3b written by ${SECONDS}s" | tee -a $L/times.txt
A="python3 -m strata bench decode $M/a3b.gguf --device cuda --ctx 4096 --prompt-tokens 32"
part resident24 30 $A --tokens 64 --vram-budget 24
R=$(sed -n "s/^GPU step *\([0-9.]*\) ms.*/\1/p" $L/resident24.log | head -n 1)
R=${R:-resident}  # not measured: each offloaded run times the resident step itself
part direct12 45 $A --tokens 128 --vram-budget 12 --gpu-floor $R --adapt-sweep 2x96,1x96,8x96,4x48,4x192,2x48
STRATA_ADAPT_SYNC=1 part direct12_before 30 $A --tokens 128 --vram-budget 12 --gpu-floor $R
part direct16 30 $A --tokens 128 --vram-budget 16 --gpu-floor $R
part cache0 35 $A --tokens 24 --vram-budget 12 --expert-cache 0 --gpu-floor $R
STRATA_ADAPT_SYNC=1 part direct16_before 30 $A --tokens 128 --vram-budget 16 --gpu-floor $R
part cpu12 30 $A --tokens 64 --vram-budget 12 --misses cpu --gpu-floor $R
echo "total ${SECONDS}s" | tee -a $L/times.txt
{
  cat $L/times.txt
  for f in $L/check.log $L/resident24.log $L/direct*.log $L/cache0.log $L/cpu12.log; do
    [ -f "$f" ] || continue
    echo "=== $(basename $f .log)"
    grep -E "^(PASS|FAIL|INFO|decode|steps|adapting|experts|PCIe|CPU pool|host loop|GPU step|floor|strata:)" "$f" \
      | cut -c1-220
    grep -E "^(adapt sweep|  [0-9])" "$f"
    grep -E "Error|Traceback" "$f" | tail -n 3
  done
} > "$OUT/adaptasync_summary.txt"
tar czf "$OUT/adaptasync_logs.tgz" -C $L .
save_cache
[ -n "${NESTED:-}" ] && rm -rf $L  # inside a session batch: the archive holds them
cat "$OUT/adaptasync_summary.txt"
