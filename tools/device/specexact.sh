#!/usr/bin/env bash
# Issue 10, verify windows bit for bit (branch specexact), one H200, under 8 minutes; carry .whl (and .devcache).
# 1) the window-exactness tests on the GPU's own kernels where they run on CUDA tensors: the decode attention's
#    per-row split against one-query launches, and the dense form against float64 (tests/kernels/attention/
#    test_decode.py: the tests that put their tensors on CUDA there);
# 2) tools/device/spec_exact_check.py on the small synthetic models: every verify-window row against plain decode's
#    step at that position, captured (graphs on), eager static, --no-graphs, and behind a 40-slot expert cache
#    (direct and CPU-pool misses) adapting (reported) and frozen (exact). Its exit status is 1 when a case marked
#    exact has a row that is not bit-equal or a greedy --spec 2/3/4 that is not plain's;
# 3) the same check on the tiny preset (N=24) as a quick second shape, plus qwen4exp tiny (Q8_0, its MTP block):
#    its windows run the eager forward, its plain steps the captured static decoder (branch specexact2: the
#    windows' QSA layers take each row as that step).
# What it should show: every exact case "N/N" bit-equal rows, "yes/yes/yes", and "ALL OK"; the adapting cases may
# differ (their rows are computed with another expert placement). Branch specexact2 fixed the frozen cache with
# CPU-pool misses, whose free-running --spec 2 differed (yes/yes/yes now), and marks qwen4exp exact.
set -uo pipefail
BUDGET=${BUDGET:-450}
source tools/device/parts.sh || exit 1
part kernels 120 python3 -m pytest -q -p no:warnings tests/kernels/attention/test_decode.py -k "window_row or dense"
part exact_small 240 python3 tools/device/spec_exact_check.py $M 40 small
part exact_tiny 90 python3 tools/device/spec_exact_check.py $M 24 tiny
echo "total ${SECONDS}s" | tee -a $L/times.txt
save_cache
[ -n "${NESTED:-}" ] || tar czf "$OUT/logs.tgz" -C $L .
cat $L/times.txt
for f in $L/kernels.log $L/exact_*.log; do echo "=== $f"; grep -hE "^\||passed|failed|ALL OK|FAILURES|rror" "$f" | tail -n 20; done
