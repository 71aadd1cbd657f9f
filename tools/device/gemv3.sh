#!/usr/bin/env bash
# One device call for the streamed decode GEMV kernels (issue 4, kernels/moe/stream_gemv.py): `bench moe-decode
# --sweep stream` on A3B Q4_0 and qwen4exp Q2_0 first (each kernel's default line, then the streamed kernels on its
# tile at as many programs an SM as stay resident, 1, 32 and 64 warps an SM and a program per tile, then the tile's
# variants and warp-local tiles, as many as stay resident; every line: us, GB/s, % of the HBM floor, x default,
# error vs float64), then the streamed kernels' CUDA tests (compiled kernels against float64), A3B Q4_K, and the
# dense `bench matvec --sweep stream` on 4096x2048 (Q4_0, Q8_0); where a batch has made $M/a3b.gguf, the captured
# decode step's tok/s and GPU time with the default GEMVs and with STRATA_GEMV_STREAM=-1 come second. Parts capped
# by tools/device/parts.sh (a smaller BUDGET cuts the later ones), under 5 minutes in all; run from the repo root
# with .whl carried. $OUT gets the sweep logs, a tarball of every log and summary.txt: each kernel's default and
# fastest config, which the output's tail repeats.
set -uo pipefail
BUDGET=${BUDGET:-285}
source tools/device/parts.sh || exit 1
L=$L/gemv3_parts; mkdir -p $L  # this script's own logs (a batch calling it shares parts.sh's directory)
part moe_decode_stream_sweep 150 python3 -m strata bench moe-decode --shapes a3b-q4_0,qwen4exp-q2_0 --sweep stream
if [ -f $M/a3b.gguf ]; then  # a batch made the A3B model: the captured decode step with and without the switch
  part decode_words 45 python3 tools/device/profile_decode.py $M/a3b.gguf --graphs on --steps 8
  part decode_stream_fit 45 env STRATA_GEMV_STREAM=-1 python3 tools/device/profile_decode.py $M/a3b.gguf \
    --graphs on --steps 8
else echo "no $M/a3b.gguf: the end-to-end A/B of STRATA_GEMV_STREAM is skipped" | tee -a $L/times.txt; fi
part gemv3_tests_cuda 45 python3 -m pytest -q -p no:cacheprovider tests/kernels/moe/test_stream_gemv.py --durations=5
part moe_decode_q4_k_sweep 60 python3 -m strata bench moe-decode --shapes a3b-q4_k --sweep stream
part matvec_stream_sweep 30 python3 -m strata bench matvec --sweep stream --shapes 4096x2048 --formats Q4_0,Q8_0
echo "total ${SECONDS}s" | tee -a $L/times.txt
# The compiled kernels for the next call, when time is left (a batch calling this script saves its own).
[ $((BUDGET - SECONDS)) -gt 30 ] && save_cache
cp $L/*sweep*.log "$OUT/" 2>/dev/null
{ cat $L/times.txt
  for f in $L/*.log; do echo "=== $f"; grep -v "^\s*$" "$f" | grep -v "sweep" | tail -n 12 | cut -c1-200; done
  grep -H "tok/s\|GPU kernel time" $L/decode_*.log 2>/dev/null
  echo "=== default and fastest config per kernel and shape (us)"
  cat $L/*sweep*.log | awk '$1 == "sweep" { key = $2 " " $3; us = ""
    for (i = 4; i < NF; i++) if ($(i + 1) == "us") { us = $i; break }
    if (us == "") next; cfg = ""; for (j = 4; j < i; j++) cfg = cfg " " $j
    if (!(key in base)) { base[key] = us; order[++n] = key }
    if (!(key in best) || us + 0 < best[key] + 0) {
      best[key] = us; how[key] = cfg; same[key] = ($0 ~ /same bytes/) ? "same bytes" : "other bytes" } }
    END { for (k = 1; k <= n; k++) printf "%-26s default %8s  best %8s %s  (%s)\n", order[k], base[order[k]],
      best[order[k]], how[order[k]], same[order[k]] }'
} > "$OUT/summary.txt"
tar czf "$OUT/gemv3_logs.tgz" -C $L .
cat "$OUT/summary.txt"
