#!/usr/bin/env bash
# One device call on two H200s (session 4): the layer split's parity on two real cards while the A3B-shape file is
# written, then `bench prompt` / `bench decode` with --gpus 0,1 against one card at the same total budget
# (multigpu.sh); then two single-GPU queues side by side, one per card: long contexts at 16K (issue 5) and
# qwen4exp's captured decode + GDN on CUDA (issue 3). Compiled kernels come back in cache.tgz for the next call.
set -uo pipefail
BUDGET=${BUDGET:-540}
source tools/device/parts.sh || exit 1
(python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 -o $M/a3b.tmp.gguf > $L/make_a3b.log 2>&1 \
  && mv $M/a3b.tmp.gguf $M/a3b.gguf) &
part mg_check 120 python3 tools/device/multigpu_check.py $M 0,1
wait
part mg_bench 200 env CHECK=0 OUT=$L/mg bash tools/device/multigpu.sh
python3 -m strata make-model --arch qwen3 --preset small --quant Q8_0 -o $M/small-qwen3.gguf >/dev/null
python3 -m strata make-model --arch qwen3next --preset small --quant Q8_0 -o $M/small-next.gguf >/dev/null
(export CUDA_VISIBLE_DEVICES=0
 part long_qwen3_16k 110 python3 -m strata bench long-context $M/small-qwen3.gguf --device cuda --prompt-tokens 16384 \
   --gen-tokens 8 --resident 8192
 part long_next_16k 100 python3 -m strata bench long-context $M/small-next.gguf --device cuda --prompt-tokens 16384 \
   --gen-tokens 8 --resident 8192) &
(export CUDA_VISIBLE_DEVICES=1
 part qwen4exp_graphs 110 python3 tools/device/qwen4exp_check.py $M graphs
 part gdn 100 env OUT=$L/gdn bash tools/device/gdn.sh) &
wait
echo "total ${SECONDS}s"
save_cache
tar czf "$OUT/logs.tgz" -C $L .
cat $L/times.txt
for f in $L/*.log $L/mg/summary.txt; do echo "=== $f"; grep -v "^\s*$" "$f" | grep -v "^-\{20\}" | tail -n 14 | cut -c1-200; done
