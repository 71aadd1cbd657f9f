#!/usr/bin/env bash
# One device call on two H200s (session 4, middle): three queues side by side. Card 0: the GEMV kernels' CUDA tests
# and sweeps (gemv_sweep.sh's parts), then `--misses direct` against the CPU pool at --vram-budget 12 (A3B shape,
# written meanwhile on the host) and the captured-decode check with its direct rows. Card 1: the prompt-attention
# tests and sweep (prompt_attn_sweep.sh), the prompt-expert sweep (moe_prefill_sweep.sh), the CPU pool's calls.
# Carry .whl and .devcache (compiled kernels of the last call); logs come back as one tarball.
set -uo pipefail
BUDGET=${BUDGET:-330}
source tools/device/parts.sh || exit 1
(python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 -o $M/a3b.tmp.gguf > $L/make_a3b.log 2>&1 \
  && mv $M/a3b.tmp.gguf $M/a3b.gguf) &
MAKE=$!
(export CUDA_VISIBLE_DEVICES=0
 part gemv_tests_cuda 80 python3 -m pytest -q -p no:cacheprovider tests/kernels/moe/test_word_gemv.py \
   tests/kernels/moe/test_gemv.py tests/kernels/quant/test_matvec.py
 part moe_decode_sweep 100 python3 -m strata bench moe-decode --sweep
 part matvec_sweep 45 python3 -m strata bench matvec --sweep --shapes 2048x4096,4096x2048 --formats Q4_0,Q4_K
 wait $MAKE 2>/dev/null; while [ ! -f $M/a3b.gguf ] && [ $SECONDS -lt 250 ]; do sleep 2; done
 for misses in direct cpu; do
   part decode_$misses 45 python3 -m strata bench decode $M/a3b.gguf --device cuda --ctx 4096 --tokens 48 \
     --prompt-tokens 32 --vram-budget 12 --misses $misses
 done
 part graphs_direct 50 python3 tools/device/decode_graphs_check.py $M 16 qwen3moe) &
(export CUDA_VISIBLE_DEVICES=1
 part attention_tests 80 python3 -m pytest -q -p no:cacheprovider tests/kernels/attention
 part pattn_sweep 130 python3 -m strata.bench.prompt_attn --sweep --variants v2 imma --no-sdpa
 part prefill_sweep 80 python3 -m strata.bench.moe_prefill --only "Q2_0 / Q2_0" --tokens 16384 --sweep --reps 3
 part pool_calls 35 python3 -m strata bench cpu-experts --calls --calls-threads 1,15 --formats Q4_0 \
   --footprint-mb 512 --reps 2) &
wait
echo "total ${SECONDS}s"
save_cache
tar czf "$OUT/logs.tgz" -C $L .
cat $L/times.txt
for f in $L/*.log; do echo "=== $f"; grep -v "^\s*$" "$f" | grep -v "^-\{20\}" | tail -n 12 | cut -c1-200; done
