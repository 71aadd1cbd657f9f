#!/usr/bin/env bash
# On the GPU machine (H200, Triton 3.6), from the repo root; issue 4, session 6 (`attnshort`): a decode step's
# attention in one launch for short spans (kernels/attention/decode_short.py), q/k norm + RoPE + the KV write in one
# launch (kernels/pointwise/qk_norm_rope_store.py), an MoE layer's add + norm, router and top-k in one launch
# (kernels/pointwise/add_norm_route.py), a gated shared expert's join + add + norm in one launch
# (kernels/pointwise/shared_gate_add_norm.py). The most telling first:
# 1. the kernels' tests compiled on CUDA (each against float64 / the kernels it replaces, byte for byte);
# (then 3.'s first profile, the default's per-layer kernels, before the sweep)
# 2. `strata bench decode-attn --sweep --sweep-spans 512,2048,8192`: the norm + store launches (two against one,
#    the same bytes?), the routing launches (three against one, per config), the shared join (two against one); per
#    span 64..32K split-K + merge against the one-launch default (us, % of the byte floor, error vs float64) and,
#    at 512, 2K and 8K, each config of the sweep beside them;
# 3. profile_decode.py on the A3B-shape qwen3moe (Q4_0, $M/a3b.gguf as session5_final.sh makes it, made here if
#    absent: +150 s), prompt 300 (span 512), default then STRATA_DECODE_ATTN_SPLITK=1 STRATA_ROUTE_SEPARATE=1 (the
#    kernels before): per layer _decode_short_kernel against _decode_split_kernel + _decode_merge_kernel, and
#    _add_norm_route_kernel against _add_rms_norm_kernel + the router GEMM + _route_topk_kernel
#    (_qk_norm_rope_store_kernel, which replaced _qk_norm_rope_kernel + _store_kv_kernel, is in both), GPU ms a token;
# 4. attn_tokens_check.py on the A3B shape: greedy tokens of the defaults against the kernels before (prompts 300
#    and 900), both switched back (last, 7., the routing alone: --only route);
# 5. decode_graphs_check.py on the small qwen3moe (fp16 and int8 KV, offload): captured == step by step;
# 6. the int8 pool and 4-row verify windows through decode-attn (no sweep).
# 7. attn_tokens_check.py --only route (prompt 300);
# 8. spec_exact_check.py on the tiny models: verify-window rows still bit-equal to steps with these kernels.
# Under 4 minutes when a3b.gguf exists (BUDGET 235 s: parts 1-4; BUDGET=500 runs 5-8 too). Files:
# attnshort_summary.txt, attnshort_logs.tgz (and the compile caches when run alone); carry .whl (and .devcache).
set -uo pipefail
BUDGET=${BUDGET:-235}
source tools/device/parts.sh || exit 1
part tests 45 python3 -m pytest -q -p no:cacheprovider tests/kernels/attention/test_decode_short.py \
  tests/kernels/attention/test_decode.py tests/kernels/pointwise/test_qk_norm_rope_store.py \
  tests/kernels/pointwise/test_fused_step_kernels.py tests/kernels/pointwise/test_add_norm_route.py \
  tests/kernels/pointwise/test_shared_gate_add_norm.py
A=$M/a3b.gguf
if [ ! -f $A ]; then
  BUDGET=$((BUDGET + 150))
  part make_a3b 150 sh -c "python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 \
    -o $M/a3b.tmp.gguf && mv $M/a3b.tmp.gguf $A"
fi
part profile_a3b 30 python3 tools/device/profile_decode.py $A --graphs on --steps 8 --prompt-tokens 300 --top 14
part sweep 75 python3 -m strata bench decode-attn --sweep --sweep-spans 512,2048,8192
part profile_a3b_before 30 env STRATA_DECODE_ATTN_SPLITK=1 STRATA_ROUTE_SEPARATE=1 python3 \
  tools/device/profile_decode.py $A --graphs on --steps 8 --prompt-tokens 300 --top 14
part tokens_a3b 55 python3 tools/device/attn_tokens_check.py $A --tokens 24 --prompts 300,900
part graphs_check 40 python3 tools/device/decode_graphs_check.py $M 16 qwen3moe
part int8_rows 25 sh -c "python3 -m strata bench decode-attn --kv int8 --spans 256,512,1024,4096,16384 && \
  python3 -m strata bench decode-attn --rows 4 --spans 512,1024,4096"
part tokens_route 40 python3 tools/device/attn_tokens_check.py $A --tokens 24 --prompts 300 --only route
part exact_tiny 90 python3 tools/device/spec_exact_check.py $M 24 tiny
echo "total ${SECONDS}s" | tee -a $L/times.txt
{
  cat $L/times.txt
  tail -n 3 $L/tests.log
  for f in sweep int8_rows tokens_a3b tokens_route; do
    echo "=== $f"; grep -v "^\s*$\|Warning\|warn(" $L/$f.log 2>/dev/null | cut -c1-230
  done
  for f in profile_a3b profile_a3b_before; do
    echo "=== $f"; grep -h "tok/s\|ms per token\|kernels per token\|decode_\|qk_norm\|store_kv\|add_\|route\|gemm\|Kernel" \
      $L/$f.log | head -n 18
  done
  for f in graphs_check exact_tiny; do echo "=== $f"; grep -h "^|\|FAIL\|Error\|OK" $L/$f.log | head -n 16; done
} > "$OUT/attnshort_summary.txt" 2>&1
cat "$OUT/attnshort_summary.txt"
tar czf "$OUT/attnshort_logs.tgz" -C $L .
save_cache
exit 0
