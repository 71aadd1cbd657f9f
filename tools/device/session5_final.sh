#!/usr/bin/env bash
# One device call on two H200s (session 5, last), every branch merged and the sweeps' defaults set. Card 0: the CUDA
# tests of the new kernels (routing in one launch, streamed GEMVs, fused Q2_0), captured decode against step by step
# (decode_graphs_check), the offload figures without host stalls (adaptasync.sh: A3B shape at 24/12/16 GiB and with
# no cache), then the A3B decode profile. Card 1: speculation on the trained default model (spec.sh: captured MTP
# drafts), then long contexts (longctx.sh: quest in the captured step, the kv-resident arm). Carry .whl and .devcache.
set -uo pipefail
BUDGET=${BUDGET:-300}
source tools/device/parts.sh || exit 1
(python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 -o $M/a3b.tmp.gguf > $L/make_a3b.log 2>&1 \
  && mv $M/a3b.tmp.gguf $M/a3b.gguf) &
script() {  # script NAME CAP [ENV...]: a branch's device script, its files in $L/NAME
  local name=$1 cap=$2; shift 2
  part "$name" "$cap" env OUT=$L/$name BUDGET=$(( cap - 10 )) "$@" bash tools/device/$name.sh
}
(export CUDA_VISIBLE_DEVICES=0
 part kernel_tests 70 python3 -m pytest -q -p no:cacheprovider tests/kernels/pointwise tests/kernels/moe/test_fused_q2_0.py \
   tests/kernels/moe/test_stream_gemv.py
 part graphs_check 40 python3 tools/device/decode_graphs_check.py $M 16 qwen3moe
 script adaptasync 150
 part profile_a3b 40 python3 tools/device/profile_decode.py $M/a3b.gguf --graphs on --steps 8 --top 12) &
(export CUDA_VISIBLE_DEVICES=1
 script spec 150 BUDGET0=140 BIG=0
 script longctx 150) &
wait
echo "total ${SECONDS}s"
tar czf "$OUT/logs.tgz" -C $L .
cat $L/times.txt
for f in $L/*.log $L/*/summary.txt $L/*/*_summary.txt $L/*/tables.txt $L/spec/*.txt; do
  [ -f "$f" ] || continue; echo "=== $f"; grep -v "^\s*$" "$f" | grep -v "^-\{20\}" | tail -n 16 | cut -c1-220; done
