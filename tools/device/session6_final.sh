#!/usr/bin/env bash
# Session 6's last call, two H200s, every branch merged and the sweeps' defaults set (one-shot GEMVs, fused Q2_0
# fp16 tiles, imma g1 / v2 t2r168x1, the hyper-connection kernels). Card 0: the full-size qwen4exp at a 12 GiB
# budget (decode, then a 4,096-token prompt), issue 4's and 6's end-to-end rows. Card 1: the new kernels' CUDA tests,
# verify windows row by row, the parity tools' tables (prompt attention at its default shapes with SDPA, the prompt
# experts at 2K/8K/16K), then the A3B shape: decode resident and at 12 GiB, the new kernels' greedy tokens against
# the old ones, the step profiled. Carry .whl and .devcache.
set -uo pipefail
BUDGET=${BUDGET:-555}
source tools/device/parts.sh || exit 1
Q=/tmp/q4x; mkdir -p $Q
(export CUDA_VISIBLE_DEVICES=0
 part make_full 240 python3 -m strata make-model --arch qwen4exp --preset full -o $Q/full.gguf
 F=$Q/full-00001-of-00002.gguf
 part full12 170 python3 -m strata bench decode $F --device cuda --ctx 4096 --prompt-tokens 32 --tokens 24 \
   --vram-budget 12
 part full_prompt12 120 python3 -m strata bench prompt $F --device cuda --vram-budget 12 --ctx 4096 --reps 1) &
(export CUDA_VISIBLE_DEVICES=1
 (nice -n 10 python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 -o $M/a3b.tmp.gguf \
   > $L/make_a3b.log 2>&1 && mv $M/a3b.tmp.gguf $M/a3b.gguf) &
 T=tests/kernels
 part cuda_tests 100 python3 -m pytest -q -p no:cacheprovider -W ignore $T/moe/test_oneshot_gemv.py \
   $T/pointwise/test_hc_kernels.py $T/attention/test_decode_short.py $T/pointwise/test_qk_norm_rope_store.py \
   $T/pointwise/test_add_norm_route.py
 part spec_exact 60 python3 tools/device/spec_exact_check.py $M 40 small
 part prompt_attn 80 python3 -m strata.bench.prompt_attn --reps 3
 part moe_prefill 60 python3 -m strata bench moe-prefill --only "Q2_0 / Q2_0" --tokens 2048,8192,16384
 while [ ! -f $M/a3b.gguf ] && [ $SECONDS -lt 330 ]; do sleep 2; done
 A="python3 -m strata bench decode $M/a3b.gguf --device cuda --ctx 4096 --prompt-tokens 32"
 part a3b_resident 30 $A --tokens 64 --vram-budget 24
 R=$(sed -n "s/^GPU step *\([0-9.]*\) ms.*/\1/p" $L/a3b_resident.log | head -n 1); R=${R:-resident}
 part a3b_12 40 $A --tokens 128 --vram-budget 12 --gpu-floor $R
 part a3b_tokens 45 python3 tools/device/attn_tokens_check.py $M/a3b.gguf --tokens 24 --prompts 300
 part a3b_profile 30 python3 tools/device/profile_decode.py $M/a3b.gguf --graphs on --steps 8 --top 14) &
wait
echo "total ${SECONDS}s" | tee -a $L/times.txt
tar czf "$OUT/logs.tgz" -C $L .
cat $L/times.txt
for f in $L/*.log; do
  echo "=== $f"; grep -v "^\s*$" "$f" | grep -v "^-\{20\}" | grep -v "Warning\|warn_once\|^strata: \(loading\|reading\)" \
    | tail -n 22 | cut -c1-200
done
