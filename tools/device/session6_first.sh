#!/usr/bin/env bash
# Session 6's first device call, two H200s. Card 0: the full-size qwen4exp (Strata's 125B shape): written (~200 s),
# then `bench decode` at a 12 GiB budget (the load's stages timed by faulthandler's dump if it is cut), then `bench
# prompt` at 12 GiB. Card 1: the A3B shape: the resident step profiled at this commit (router reverted), the
# --expert-cache 0 and 16 GiB rows; the verify windows against plain decode row by row (spec_exact_check.py); long
# contexts at 32K. Carry .whl and .devcache.
set -uo pipefail
BUDGET=${BUDGET:-560}
source tools/device/parts.sh || exit 1
Q=/tmp/q4x; mkdir -p $Q
(export CUDA_VISIBLE_DEVICES=0
 df -h /tmp | tail -1 > $L/disk.txt
 part make_full 260 python3 -m strata make-model --arch qwen4exp --preset full -o $Q/full.gguf
 F=$Q/full-00001-of-00002.gguf
 part full12 200 python3 -m strata bench decode $F --device cuda --ctx 4096 --prompt-tokens 32 --tokens 24 \
   --vram-budget 12
 part full_prompt12 90 python3 -m strata bench prompt $F --device cuda --vram-budget 12 --ctx 4096 --reps 1) &
(export CUDA_VISIBLE_DEVICES=1
 part make_a3b 120 python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 -o $M/a3b.gguf
 part profile_a3b 45 python3 tools/device/profile_decode.py $M/a3b.gguf --graphs on --steps 8 --top 12
 part spec_exact 120 python3 tools/device/spec_exact_check.py $M 40
 A="python3 -m strata bench decode $M/a3b.gguf --device cuda --ctx 4096 --prompt-tokens 32"
 part resident24 35 $A --tokens 64 --vram-budget 24
 R=$(sed -n "s/^GPU step *\([0-9.]*\) ms.*/\1/p" $L/resident24.log | head -n 1); R=${R:-resident}
 part cache0 40 $A --tokens 24 --vram-budget 12 --expert-cache 0 --gpu-floor $R
 part direct16 35 $A --tokens 128 --vram-budget 16 --gpu-floor $R
 for arch in qwen3 qwen3next; do
   python3 -m strata make-model --arch $arch --preset small --quant Q8_0 -o $M/small-$arch.gguf >/dev/null 2>&1; done
 part qwen3_32k 70 python3 -m strata bench long-context $M/small-qwen3.gguf --device cuda --prompt-tokens 32768 \
   --gen-tokens 16 --resident 8192) &
wait
echo "total ${SECONDS}s" | tee -a $L/times.txt
save_cache
tar czf "$OUT/logs.tgz" -C $L .
cat $L/times.txt $L/disk.txt
for f in $L/*.log; do
  echo "=== $f"; grep -v "^\s*$" "$f" | grep -v "^-\{20\}" | grep -v "^strata: \(loading\|reading\)" | tail -n 18 | cut -c1-200
done
