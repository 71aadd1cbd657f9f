#!/usr/bin/env bash
# One device call for the decode GEMV tiles (issue 4): the CUDA tests of the GEMV files (compiled kernels against
# float64), then `bench moe-decode --sweep` on A3B Q4_0 / Q4_K and qwen4exp Q2_0 (each kernel under
# bench/gemv_sweep.py's configs, every line: us, GB/s, % of the HBM floor, x default), the dense `bench matvec
# --sweep` (A3B's 2048x4096 / 4096x2048 in Q4_0, Q8_0, Q4_K; qwen4exp's Q2_0 shapes; a Q4_K head), and last the
# i-quant gate/up shapes of qwen4exp (IQ2_XS, IQ3_XXS, IQ3_S words against their byte kernels). Parts capped by
# tools/device/parts.sh, under 7 minutes in all; run from the repo root with .whl carried; logs come back as one
# tarball plus the sweep logs; the output's tail ends with each kernel's default and fastest config.
set -uo pipefail
BUDGET=${BUDGET:-405}
source tools/device/parts.sh || exit 1
part gemv_tests_cuda 100 python3 -m pytest -q -p no:cacheprovider tests/kernels/moe/test_word_gemv.py \
  tests/kernels/moe/test_gemv.py tests/kernels/quant/test_matvec.py tests/kernels/quant/test_bench_matvec.py \
  --durations=5
part moe_decode_sweep 160 python3 -m strata bench moe-decode --sweep
part matvec_sweep 80 python3 -m strata bench matvec --sweep --shapes 2048x4096,4096x2048 --formats Q4_0,Q8_0,Q4_K
part matvec_sweep_q2_0 35 python3 -m strata bench matvec --sweep --shapes 2560x640,640x2560,2560x10240 \
  --formats Q2_0
part matvec_sweep_head 25 python3 -m strata bench matvec --sweep --shapes 2048x151936 --formats Q4_K
part moe_decode_iq_sweep 60 python3 -m strata bench moe-decode --sweep \
  --shapes qwen4exp-iq2_xs,qwen4exp-iq3_xxs,qwen4exp-iq3_s
echo "total ${SECONDS}s" | tee -a $L/times.txt
save_cache
cp $L/moe_decode_sweep.log $L/matvec_sweep.log "$OUT/" 2>/dev/null
tar czf "$OUT/gemv_sweep_logs.tgz" -C $L .
cat $L/times.txt
for f in $L/*.log; do echo "=== $f"; grep -v "^\s*$" "$f" | grep -v "sweep" | tail -n 14 | cut -c1-200; done
echo "=== default and fastest config per kernel and shape (us)"
cat $L/*sweep*.log | awk '$1 == "sweep" { key = $2 " " $3; us = ""
  for (i = 4; i < NF; i++) if ($(i + 1) == "us") { us = $i; break }
  if (us == "") next; cfg = ""; for (j = 4; j < i; j++) cfg = cfg " " $j
  if (!(key in base)) { base[key] = us; order[++n] = key }
  if (!(key in best) || us + 0 < best[key] + 0) { best[key] = us; how[key] = cfg } }
  END { for (k = 1; k <= n; k++) printf "%-26s default %8s  best %8s %s\n", order[k], base[order[k]], best[order[k]], how[order[k]] }'
