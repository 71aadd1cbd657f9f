#!/usr/bin/env bash
# On the GPU machine (H200, Triton 3.6), from the repo root; issue 4, session 9 (`chain`): a decode layer in three
# launches (STRATA_DECODE_CHAIN): the q/k/v matvec + q/k norm + RoPE + KV store as one (chain_qkv_store.py), the
# attention, and the o projection + add + norm + routing + experts' gate/up + down + closing add + norm as one
# (kernels/moe/chain_moe.py), each chained by counters; all resident, the A3B shape. In order:
# 1. the chains' tests compiled on CUDA (test_chain_moe.py, test_chain_qkv_store.py: each chained launch against
#    the separate launches at its warps byte for byte, held-back counters, the counters zero after each launch);
# 2. (while the A3B file is made, ~90 s, if absent) `bench moe-chain --sweep` at the A3B shape: the five launches
#    against the chained one per config (warps:gate_up_bn:down_bn[:matvec_bn[:route_experts]]), us, % of the
#    floor, "=" where the chained bytes are the five launches' at its warps: the config to make the default; then
#    the attention half (q/k/v matvec + norm + RoPE + store: two launches against one) per distinct tile;
# 3. `bench decode` with the switch off, then on (STRATA_DECODE_CHAIN=1): tok/s, GPU step, % of the HBM bound
#    (the session's 1.95 ms step, 21.8 %: the goal is 60 %);
# 4. chain_check.py: greedy tokens and logits with the chains (default, and 4 warps) against unset, captured;
# 5. profile_decode.py under the switch: the kernels a layer (eight -> three) and their times;
# 6. as time allows: bench moe-chain at the qwen4exp Q2_0 shape (default config).
# Under 6 minutes (BUDGET 350 s, + 90 s while a3b.gguf is made); logs in $OUT (chain_logs.tgz, chain_summary.txt;
# the compile caches when run alone). Carry .whl (and .devcache).
set -uo pipefail
BUDGET=${BUDGET:-350}
source tools/device/parts.sh || exit 1
A=$M/a3b.gguf
make_a3b_bg && BUDGET=$((BUDGET + 90))
part tests 90 python3 -m pytest -q -p no:cacheprovider tests/kernels/moe/test_chain_moe.py \
  tests/kernels/pointwise/test_chain_qkv_store.py
part chain_sweep 100 python3 -m strata bench moe-chain --shapes a3b-q4_0 --sweep
wait_file $A $((BUDGET - 150))
B="python3 -m strata bench decode $A --device cuda --ctx 4096 --prompt-tokens 32 --tokens 64"
part bench_off 40 env STRATA_DECODE_CHAIN= $B
part bench_chain 40 env STRATA_DECODE_CHAIN=1 $B
part check_a3b 50 python3 tools/device/chain_check.py $A --tokens 24 --configs 1,4:0:0
part profile_chain 30 env STRATA_DECODE_CHAIN=1 python3 tools/device/profile_decode.py $A --graphs on --steps 8 --top 14
part chain_q4x 30 python3 -m strata bench moe-chain --shapes qwen4exp-q2_0
{
  cat $L/times.txt
  tail -n 3 $L/tests.log
  for f in chain_sweep chain_q4x; do
    echo "=== $f"; grep -h "launches\|x five\|x two\|apply" $L/$f.log 2>/dev/null | cut -c1-230
  done
  for f in bench_off bench_chain; do
    echo "=== $f"; grep -v "^\s*$\|Warning\|warn(" $L/$f.log 2>/dev/null | tail -n 12 | cut -c1-230
  done
  echo "=== check_a3b"; grep -h "captured\|PASS\|FAIL\|Error" $L/check_a3b.log | cut -c1-230
  echo "=== profile_chain"; grep -h "tok/s\|ms per token\|kernels per token\|_kernel" $L/profile_chain.log \
    | head -n 18 | cut -c1-160
} > $OUT/chain_summary.txt
cat $OUT/chain_summary.txt
summarize chain "launches|x five|x two|tok/s|GPU|HBM|PASS|FAIL|Error|passed|failed"
