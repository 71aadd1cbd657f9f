#!/usr/bin/env bash
# On the GPU machine (H200, Triton 3.6), from the repo root; issue 4, session 6 (`hcfuse`): qwen4exp's hyper-
# connection read on 1-4 rows in three Triton launches (kernels/hc), the previous write folded in.
# 1. the kernels' tests compiled on CUDA (tests/kernels/pointwise/test_hc_kernels.py: against torch and float64,
#    a window's rows bit-equal to one-row calls);
# 2. `strata bench hc-read --sweep`: torch vs the kernels per read at the full shape (embd 2,560, hc 4, rank 320)
#    for 1, 2 and 4 rows, each kernel's configs beside its default, and a 4,096-row prompt read;
# 3. profile_decode.py on full-size qwen4exp layers (a batch's 12 if there, else 4 made here): GPU ms and kernels
#    per token with the kernels, then with STRATA_HC_TORCH=1 (the torch reads, as before this branch);
# 4. a verify window's rows against one-token steps on the tiny qwen4exp (hc_window_check.py): 4/4 bit-equal;
# 5. captured decode against step by step on the tiny qwen4exp (qwen4exp_check.py graphs): must capture and agree.
# Under 4 minutes (BUDGET 235 s; 190 s nested in session6_mid.sh, which makes the 12 layers); carry .whl (and
# .devcache). Files: hcfuse_summary.txt, hcfuse_logs.tgz (and the compile caches when run alone).
set -uo pipefail
BUDGET=${BUDGET:-235}
source tools/device/parts.sh || exit 1  # nested in a session batch: its setup, logs in $OUT/logs
L=$OUT/hcfuse_logs; mkdir -p $L
part tests 25 python3 -m pytest -q -p no:cacheprovider tests/kernels/pointwise/test_hc_kernels.py
part sweep 55 python3 -m strata bench hc-read --rows 1,2,4 --sweep
F=$M/q4x12-00001-of-00002.gguf  # a session batch's 12 full-size layers when it made them, else 4 made here
if [ ! -f $F ]; then
  F=$M/q4x4-00001-of-00002.gguf
  [ -f $F ] || part make_q4x4 80 python3 -m strata make-model --arch qwen4exp --preset full --layers 4 -o $M/q4x4.gguf
fi
part profile_kernels 30 python3 tools/device/profile_decode.py $F --graphs on --steps 8 --top 16
part profile_torch 30 env STRATA_HC_TORCH=1 python3 tools/device/profile_decode.py $F --graphs on --steps 8 --top 16
Q=$(mktemp -d /tmp/hcfuse-q4.XXXX)
part window 25 python3 tools/device/hc_window_check.py $Q
part graphs_qwen4exp 40 python3 tools/device/qwen4exp_check.py $Q graphs
rm -rf "$Q"
echo "total ${SECONDS}s" | tee -a $L/times.txt
{
  cat $L/times.txt
  tail -n 3 $L/tests.log
  cat $L/sweep.log
  tail -n 2 $L/window.log
  grep -h "tok/s\|FAIL\|Error\|error" $L/graphs_qwen4exp.log | head -n 20
  for p in profile_kernels profile_torch; do echo "== $p"; head -n 30 $L/$p.log; done
} > "$OUT/hcfuse_summary.txt" 2>&1
cat "$OUT/hcfuse_summary.txt"
tar czf "$OUT/hcfuse_logs.tgz" -C $L .
save_cache
exit 0
