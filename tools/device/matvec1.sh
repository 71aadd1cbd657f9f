#!/usr/bin/env bash
# One device call for the one-shot decode GEMVs (issue 4, kernels/moe/oneshot_gemv.py: a program loads every weight
# of its rows at once). First their CUDA tests (compiled kernels against float64; a verify window's rows equal
# one-row calls bit for bit), then `--sweep oneshot` lines beside each kernel's current default (us, GB/s, % of the
# HBM floor, x default, error vs float64, same bytes as the default?): `bench moe-decode` on A3B Q4_0 and qwen4exp
# Q2_0 (gate_up and down), `bench matvec` on A3B's q/k/v (2048x5120) and o (4096x2048) in Q4_0 and qwen4exp's GDN
# q/k/v (2560x10240) in Q2_0, then A3B Q4_K, a 4-row window of the q/k/v matvec and A3B's Q4_0 head; where a batch
# has made $M/a3b.gguf, the captured decode step with and without STRATA_GEMV_ONESHOT=1 last. Parts capped by
# tools/device/parts.sh (a smaller BUDGET cuts the later ones; the first four fill 220 s of a fresh machine's
# compiles, the rest run on a warm Triton cache), under 4 minutes in all; run from the repo root with
# .whl carried. $OUT gets the sweep logs, a tarball of every log and summary.txt: each kernel's default and fastest
# config, which the output's tail repeats.
set -uo pipefail
BUDGET=${BUDGET:-235}
source tools/device/parts.sh || exit 1
L=$L/matvec1_parts; mkdir -p $L  # this script's own logs (a batch calling it shares parts.sh's directory)
part oneshot_tests_cuda 40 python3 -m pytest -q -p no:cacheprovider tests/kernels/moe/test_oneshot_gemv.py --durations=5
part moe_decode_a3b_q4_0_sweep 70 python3 -m strata bench moe-decode --shapes a3b-q4_0 --sweep oneshot
part matvec_a3b_sweep 50 python3 -m strata bench matvec --sweep oneshot --shapes 2048x5120,4096x2048 --formats Q4_0
part moe_decode_q2_0_sweep 60 python3 -m strata bench moe-decode --shapes qwen4exp-q2_0 --sweep oneshot
part matvec_q2_0_sweep 20 python3 -m strata bench matvec --sweep oneshot --shapes 2560x10240 --formats Q2_0
part moe_decode_a3b_q4_k_sweep 45 python3 -m strata bench moe-decode --shapes a3b-q4_k --sweep oneshot
part matvec_window_sweep 20 python3 -m strata bench matvec --sweep oneshot --shapes 2048x5120 --formats Q4_0 --rows 4
part matvec_head 20 python3 -m strata bench matvec --shapes 2048x151936 --formats Q4_0 --sweep oneshot
if [ -f $M/a3b.gguf ]; then  # a batch made the A3B model: the captured decode step with and without the switch
  part decode_default 40 python3 tools/device/profile_decode.py $M/a3b.gguf --graphs on --steps 8
  part decode_oneshot 40 env STRATA_GEMV_ONESHOT=1 python3 tools/device/profile_decode.py $M/a3b.gguf \
    --graphs on --steps 8
else echo "no $M/a3b.gguf: the end-to-end A/B of STRATA_GEMV_ONESHOT is skipped" | tee -a $L/times.txt; fi
echo "total ${SECONDS}s" | tee -a $L/times.txt
cp $L/*sweep*.log "$OUT/" 2>/dev/null
{ cat $L/times.txt
  for f in $L/*.log; do echo "=== $f"; grep -v "^\s*$" "$f" | grep -v "sweep" | tail -n 12 | cut -c1-200; done
  grep -H "tok/s\|GPU kernel time" $L/decode_*.log 2>/dev/null
  echo "=== default and fastest config per kernel and shape (us)"
  cat $L/*sweep*.log | awk '$1 == "sweep" { key = $2 " " $3 (($4 ~ /^x[0-9]/) ? " " $4 : ""); us = ""
    for (i = 4; i < NF; i++) if ($(i + 1) == "us") { us = $i; break }
    if (us == "") next; cfg = ""; for (j = 4; j < i; j++) cfg = cfg " " $j
    if (!(key in base)) { base[key] = us; order[++n] = key }
    if (!(key in best) || us + 0 < best[key] + 0) {
      best[key] = us; how[key] = cfg; same[key] = ($0 ~ /same bytes/) ? "same bytes" : "other bytes" } }
    END { for (k = 1; k <= n; k++) printf "%-30s default %8s  best %8s %s  (%s)\n", order[k], base[order[k]],
      best[order[k]], how[order[k]], same[order[k]] }'
} > "$OUT/summary.txt"
tar czf "$OUT/matvec1_logs.tgz" -C $L .
cat "$OUT/summary.txt"
