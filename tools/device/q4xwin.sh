#!/usr/bin/env bash
# Issue 10, qwen4exp's verify windows through its captured static step (branch q4xwin), one H200, under 4 minutes;
# carry .whl (and .devcache).
# 1) tools/device/spec_exact_check.py qwen4exp: the tiny qwen4exp (Q8_0, its MTP block) with an indexer budget of
#    8 (every row selects past 11 cells), graphs on then the uncaptured static step, then a budget of 253 with a
#    250-token prompt (windows at the span of 512 hold rows whose steps attended densely at 256 and rows that
#    select). Every window row against plain decode's captured step at that position, and greedy --spec 2/3/4.
#    Should show: "[windows: captured]" on the graphs-on rows, every row "N/N" bit-equal, "yes/yes/yes", "ALL OK"
#    (exit 1 otherwise).
# 2) `strata bench spec` on the tiny qwen4exp with an MTP head (--spec 1/2/3/4): "verify windows through captured
#    CUDA graphs", each window's cost in decode steps ("verify window: 1 rows ... 4 rows ..."), the tok/s table
#    (greedy = plain: yes on every row), and where a window's time goes, its drafts "MTP through captured graphs"
#    (qwen4exp's MTP block through spec_mtp.MTPSteps since this branch).
# 3) tools/device/spec_mtp_check.py qwen4exp: its greedy MTP drafts through captured graphs against eager ones on
#    the same histories: "MTP captured yes", drafts equal >= 90% of windows, greedy = plain "yes/yes", "ALL OK";
#    "syncs per window": the host reads a window costs (reported; qwen3next's cost 2: the picks, then the argmax).
# BIG=1 (then give it 8 minutes: BUDGET=450) adds 4) the same bench on 4 full-size layers with the MTP block
#    (make-model --preset full --layers 4 --mtp: the real QSA / GDN / MoE / hc shapes, 2 shards, the second the
#    n-gram table), --spec 1/2/4: what a window of real-shape rows costs against a captured step.
set -uo pipefail
BUDGET=${BUDGET:-230}
BIG=${BIG:-0}
source tools/device/parts.sh || exit 1
part exact_qwen4exp 110 python3 tools/device/spec_exact_check.py $M 40 qwen4exp
T=$M/q4xwin-tiny-mtp.gguf
F=$M/q4xwin-tiny-mtp-00001-of-00002.gguf
[ -f $F ] || part make_tiny 20 python3 -m strata make-model --arch qwen4exp --preset tiny --quant Q8_0 --mtp -o $T
part bench_spec 60 python3 -m strata bench spec $F --device cuda --prompt-tokens 256 --gen-tokens 64
part mtp_qwen4exp 45 python3 tools/device/spec_mtp_check.py $M 40 qwen4exp
if [ "$BIG" != 0 ]; then
  G=$M/q4xwin-full4-mtp-00001-of-00002.gguf
  [ -f $G ] || part make_full4 150 python3 -m strata make-model --arch qwen4exp --preset full --layers 4 --mtp \
    -o $M/q4xwin-full4-mtp.gguf
  part bench_spec_full4 120 python3 -m strata bench spec $G --device cuda --prompt-tokens 512 --gen-tokens 32 \
    --reps 1 --windows 1,2,4
fi
echo "total ${SECONDS}s" | tee -a $L/times.txt
save_cache
[ -n "${NESTED:-}" ] || tar czf "$OUT/logs.tgz" -C $L .
cat $L/times.txt
for f in $L/exact_qwen4exp.log $L/bench_spec*.log $L/mtp_qwen4exp.log; do
  echo "=== $f"; grep -hE "^\||^decode step|^verify|pays|^model|^where|ALL OK|FAILURES|rror" "$f" | tail -n 30
done
