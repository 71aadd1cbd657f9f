#!/usr/bin/env bash
# Session 6's middle call, two H200s, the branches merged. Card 0: qwen4exp on 12 full-size layers (make-model
# --layers 12): the 4,096-token prompt profiled all resident and at a budget that caches the same share of experts
# as 12 GiB does for 48 layers; then hcfuse's script (the residual's kernels, the step profiled again). Card 1: the
# kernel branches' scripts (attnshort, matvec1, pfepilogue, immapv), then the verify windows row by row. A branch's
# script that is not there is skipped. The misses' GEMVs beside the hits' (a second stream) against one stream. Carry .whl and .devcache.
set -uo pipefail
BUDGET=${BUDGET:-560}
source tools/device/parts.sh || exit 1
script() {  # script NAME CAP: a branch's device script, its files in $L/NAME
  local name=$1 cap=$2
  [ -f tools/device/$name.sh ] || { echo "$name: no script" | tee -a $L/times.txt; return; }
  part "$name" "$cap" env OUT=$L/$name BUDGET=$(( cap - 10 )) bash tools/device/$name.sh
}
(export CUDA_VISIBLE_DEVICES=0
 part make_q4x12 100 python3 -m strata make-model --arch qwen4exp --preset full --layers 12 -o $M/q4x12.gguf
 F=$M/q4x12-00001-of-00002.gguf
 part prompt_resident 60 python3 tools/device/profile_prompt.py $F --tokens 4096 --rows 30
 part prompt_budget 80 python3 tools/device/profile_prompt.py $F --tokens 4096 --rows 30 --vram-budget 4.4
 part decode_budget 50 python3 tools/device/profile_decode.py $F --graphs on --steps 8 --top 30 --vram-budget 4.4
 B="python3 -m strata bench decode $F --device cuda --ctx 4096 --prompt-tokens 32 --tokens 48 --vram-budget 4.4"
 part misses_beside 40 $B
 STRATA_MISSES_SERIAL=1 part misses_serial 40 $B
 script hcfuse 180) &
(export CUDA_VISIBLE_DEVICES=1
 (nice -n 10 python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 -o $M/a3b.tmp.gguf \
   > $L/make_a3b.log 2>&1 && mv $M/a3b.tmp.gguf $M/a3b.gguf) &
 script immapv 100
 script pfepilogue 100
 while [ ! -f $M/a3b.gguf ] && [ $SECONDS -lt 300 ]; do sleep 2; done
 script attnshort 150
 script matvec1 130
 part spec_exact 60 python3 tools/device/spec_exact_check.py $M 40 small) &
wait
echo "total ${SECONDS}s" | tee -a $L/times.txt
save_cache
tar czf "$OUT/logs.tgz" -C $L .
cat $L/times.txt
for f in $L/*.log $L/*/*.txt; do
  [ -f "$f" ] || continue
  echo "=== $f"; grep -v "^\s*$" "$f" | grep -v "^-\{20\}" | grep -v "Warning\|warn_once" | tail -n 24 | cut -c1-200
done
