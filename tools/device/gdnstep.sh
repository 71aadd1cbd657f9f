#!/usr/bin/env bash
# On the GPU machine (H200, Triton 3.6), from the repo root; issue 4, session 5 (`gdnstep`): the GatedDeltaNet
# decode step in few launches (the conv + beta/g kernel, the output-gate kernel, qkv/gate/b/a through one matvec).
# 1. the kernels' tests compiled on CUDA (tests/kernels/pointwise: each against torch and float64);
# 2. `strata bench gdn-step --sweep`: each kernel's configs beside the default at the A3B shape (1 row);
# 3. captured decode against step by step on the small qwen3next (decode_graphs_check.py) and qwen4exp tiny
#    (qwen4exp_check.py graphs): must still capture and agree;
# 4. profile_decode.py on the A3B-shape qwen3next (Q4_0, the session batches' $M/next-a3b.gguf, made if absent):
#    GPU ms per token and kernels per token (before: 5.55 ms captured, qwen3moe of the shape 3.26 ms).
# Under 3 minutes when the A3B file exists (BUDGET 178 s, +150 s to make it); carry .whl (and .devcache).
# Files: gdnstep_summary.txt, gdnstep_logs.tgz (and the compile caches when run alone).
set -uo pipefail
BUDGET=${BUDGET:-178}
source tools/device/parts.sh || exit 1  # nested in a session batch: its setup, logs in $OUT/logs
L=$OUT/gdnstep_logs; mkdir -p $L
part tests 35 python3 -m pytest -q -p no:cacheprovider tests/kernels/pointwise/test_gdn_step_kernels.py
part sweep 45 python3 -m strata bench gdn-step --sweep
part graphs_next 45 python3 tools/device/decode_graphs_check.py $M 16 qwen3next
Q=$(mktemp -d /tmp/gdnstep-q4.XXXX)
part graphs_qwen4exp 45 python3 tools/device/qwen4exp_check.py $Q graphs
rm -rf "$Q"
A=$M/next-a3b.gguf
if [ ! -f $A ]; then
  BUDGET=$((BUDGET + 150))
  part make_a3b 150 python3 -m strata make-model --arch qwen3next --preset qwen3-30b-a3b --quant Q4_0 --mtp -o $A
fi
part profile_a3b 60 python3 tools/device/profile_decode.py $A --steps 8 --ctx 4096
echo "total ${SECONDS}s" | tee -a $L/times.txt
{
  cat $L/times.txt
  tail -n 3 $L/tests.log
  cat $L/sweep.log
  grep -h "tok/s\|ms per token\|kernels per token\|FAIL\|Error" $L/graphs_next.log $L/graphs_qwen4exp.log \
    $L/profile_a3b.log | head -n 40
} > "$OUT/gdnstep_summary.txt" 2>&1
cat "$OUT/gdnstep_summary.txt"
tar czf "$OUT/gdnstep_logs.tgz" -C $L .
save_cache
exit 0
