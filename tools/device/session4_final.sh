#!/usr/bin/env bash
# One device call on two H200s (session 4, last), after the session's branches merged. Phase 1, while the A3B-shape
# file is written: card 0 the fused decode-step kernels' and GEMV kernels' CUDA tests, then the layer split's
# parity on both cards (split graphs); card 1 the prompt-expert parity (Q2_0 shapes from the sweep) and the
# prompt-attention parity table (new defaults). Phase 2: card 0 the A3B decode profile (resident, captured), decode
# and prompt at --vram-budget 12 (direct misses, borrowed work buffers); card 1 qwen4exp's captured decode. Phase 3:
# decode across both cards. Carry .whl and .devcache.
set -uo pipefail
BUDGET=${BUDGET:-300}
source tools/device/parts.sh || exit 1
(python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 -o $M/a3b.tmp.gguf > $L/make_a3b.log 2>&1 \
  && mv $M/a3b.tmp.gguf $M/a3b.gguf) &
(export CUDA_VISIBLE_DEVICES=0
 part pointwise_tests 40 python3 -m pytest -q -p no:cacheprovider tests/kernels/pointwise
 part gemv_tests 30 python3 -m pytest -q -p no:cacheprovider tests/kernels/moe/test_gemv.py -k "byte_kernels_too or slots"
 CUDA_VISIBLE_DEVICES=0,1 part mg_graphs 70 python3 tools/device/multigpu_check.py $M 0,1 graphs
 while [ ! -f $M/a3b.gguf ] && [ $SECONDS -lt 200 ]; do sleep 2; done
 part profile_a3b 50 python3 tools/device/profile_decode.py $M/a3b.gguf --graphs on --steps 8
 part decode_12 40 python3 -m strata bench decode $M/a3b.gguf --device cuda --ctx 4096 --tokens 48 --prompt-tokens 32 \
   --vram-budget 12
 part prompt_12 45 python3 -m strata bench prompt $M/a3b.gguf --device cuda --ctx 4096 --vram-budget 12) &
(export CUDA_VISIBLE_DEVICES=1
 part prefill_parity 50 python3 -m strata.bench.moe_prefill --only "Q2_0 / Q2_0" --tokens 2048,16384
 part pattn_parity 70 python3 -m strata.bench.prompt_attn --variants fp32 v2 imma
 part qwen4exp_graphs 60 python3 tools/device/qwen4exp_check.py $M graphs) &
wait
part decode_split 40 python3 -m strata bench decode $M/a3b.gguf --gpus 0,1 --ctx 4096 --tokens 32 --prompt-tokens 32 \
  --vram-budget 6
echo "total ${SECONDS}s"
tar czf "$OUT/logs.tgz" -C $L .
cat $L/times.txt
for f in $L/*.log; do echo "=== $f"; grep -v "^\s*$" "$f" | grep -v "^-\{20\}" | tail -n 12 | cut -c1-200; done
