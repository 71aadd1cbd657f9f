#!/usr/bin/env bash
# One device call on two H200s (session 5, first): figures for the code as it stands. While the model files are
# written (A3B shape qwen3moe, A3B shape qwen3next with an MTP block, the full qwen4exp), card 0 runs speculation
# (issue 10: captured verify windows on the trained default model, then the A3B shape resident and at 12 GiB), and
# the kv-resident long-context arm (issue 5); card 1 the issue-4 decode figures: A3B at --vram-budget 24, with
# --expert-cache 0 (the all-CPU baseline), then the full qwen4exp at 12 and 24 GiB. Carry .whl and .devcache.
set -uo pipefail
BUDGET=${BUDGET:-540}
source tools/device/parts.sh || exit 1
make_bg() {  # make_bg NAME ARGS...: write $M/NAME.gguf in the background
  local name=$1; shift
  (python3 -m strata make-model "$@" -o $M/$name.tmp.gguf > $L/make_$name.log 2>&1 && mv $M/$name.tmp.gguf $M/$name.gguf) &
}
wait_for() { while [ ! -f "$1" ] && [ $SECONDS -lt $((BUDGET - 30)) ]; do sleep 2; done; }
make_bg a3b --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0
make_bg next-a3b --arch qwen3next --preset qwen3-30b-a3b --quant Q4_0 --mtp
make_bg q4x --arch qwen4exp --preset full
D=strata/data/default-model/strata-default-qwen3next-q8_0.gguf
(export CUDA_VISIBLE_DEVICES=0
 part spec_default 70 python3 -m strata bench spec $D --device cuda --prompt-tokens 256 --gen-tokens 96
 part spec_default_sfx 60 python3 -m strata bench spec $D --device cuda --prompt-tokens 256 --gen-tokens 96 \
   --suffix-draft 3 --spec-min-p 0.3
 wait_for $M/next-a3b.gguf
 part spec_a3b 80 python3 -m strata bench spec $M/next-a3b.gguf --device cuda --prompt-tokens 512 --gen-tokens 48 \
   --suffix-draft 3 --reps 1
 part spec_a3b_12 80 python3 -m strata bench spec $M/next-a3b.gguf --device cuda --prompt-tokens 512 --gen-tokens 24 \
   --suffix-draft 3 --reps 1 --windows 1,2,4 --vram-budget 12
 python3 -m strata make-model --arch qwen3 --preset small --quant Q8_0 -o $M/small-qwen3.gguf >/dev/null
 part long_resident_16k 100 python3 -m strata bench long-context $M/small-qwen3.gguf --device cuda --prompt-tokens 16384 \
   --gen-tokens 4 --resident 8192 --arms quest,quest+resident) &
(export CUDA_VISIBLE_DEVICES=1
 wait_for $M/a3b.gguf
 part decode_24 50 python3 -m strata bench decode $M/a3b.gguf --device cuda --ctx 4096 --tokens 64 --prompt-tokens 32 \
   --vram-budget 24
 part decode_cache0 70 python3 -m strata bench decode $M/a3b.gguf --device cuda --ctx 4096 --tokens 24 --prompt-tokens 32 \
   --vram-budget 12 --expert-cache 0
 wait_for $M/q4x.gguf
 part q4x_info 30 python3 -m strata info $M/q4x.gguf --plan --vram-budget 12
 part q4x_decode_12 110 python3 -m strata bench decode $M/q4x.gguf --device cuda --ctx 4096 --tokens 32 --prompt-tokens 32 \
   --vram-budget 12
 part q4x_decode_24 90 python3 -m strata bench decode $M/q4x.gguf --device cuda --ctx 4096 --tokens 32 --prompt-tokens 32 \
   --vram-budget 24) &
wait
echo "total ${SECONDS}s"
tar czf "$OUT/logs.tgz" -C $L .
save_cache
cat $L/times.txt
for f in $L/*.log; do echo "=== $f"; grep -v "^\s*$" "$f" | grep -v "^-\{20\}" | tail -n 14 | cut -c1-220; done
