#!/usr/bin/env bash
# On the GPU machine (H200, Triton 3.6), from the repo root; issue 4, session 8 (`pdl`): the decode step's kernels
# with programmatic dependent launch (STRATA_PDL, kernels/pdl.py), all resident on the A3B shape. In order:
# 1. the tests compiled on CUDA: tests/kernels/pdl (each kernel's PDL form launched for real with launch_pdl, the
#    default form's bytes; where the grid dependency instructions sit in the sm_90 builds);
# 2. (while the A3B file is made, ~90 s, if absent) pdl_check.py on a small qwen3next and the tiny qwen4exp: greedy
#    tokens and logits bytes with STRATA_PDL=1, 2 and 3 against unset, each captured;
# 3. `bench decode --pdl-sweep 1,3,2,0` on the A3B shape (Q4_0, --vram-budget 24: all resident): unset, then each
#    mode's graphs captured afresh in the same process, then unset again (drift): tok/s, median step and the GPU
#    step (the session's 447.9 tok/s / 2.10 ms GPU step against a 0.45 ms HBM bound): the mode to keep;
# 4. pdl_check.py on the A3B shape (32 tokens: tokens equal, logits byte-equal, each mode captured);
# 5. profile_decode.py unset and with STRATA_PDL=1: per-kernel device time (the eight kernels a layer) and GPU ms a
#    token. Note: a kernel's time under PDL counts from its launch, so a kernel launched early and waiting shows
#    longer; the step's tok/s and the GPU ms a token are what tell; last, bench decode in a process started with
#    STRATA_PDL=1 (the switch read from the environment);
# 6. as time allows: the offloaded A3B (--vram-budget 12, direct misses) unset and with modes 1 and 3.
# Under 4 minutes with a3b.gguf present (BUDGET 235 s; 2. and 6. then run last, as time allows), 5.5 without (2.
# runs while the file is made); logs in $OUT (logs.tgz, pdl_summary.txt; the compile caches when run alone).
# Carry .whl (and .devcache).
set -uo pipefail
BUDGET=${BUDGET:-235}
source tools/device/parts.sh || exit 1
A=$M/a3b.gguf N=$M/pdl-next-small.gguf Q=$M/pdl-q4x-tiny-00001-of-00002.gguf
small() {  # 2.: the small qwen3next and the tiny qwen4exp
  part make_small 40 sh -c "[ -f $N ] || python3 -m strata make-model --arch qwen3next --preset small --quant Q4_0 \
    -o $N; [ -f $Q ] || python3 -m strata make-model --arch qwen4exp --preset tiny --quant Q8_0 -o $M/pdl-q4x-tiny.gguf"
  part check_qwen3next 40 python3 tools/device/pdl_check.py $N --tokens 24 --modes 1,2,3
  part check_qwen4exp 40 python3 tools/device/pdl_check.py $Q --tokens 24 --modes 1,2,3
}
MADE=
if [ ! -f $A ]; then
  BUDGET=$((BUDGET + 90)) MADE=1
  (python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 -o $M/a3b.tmp.gguf \
    > $L/make_a3b.log 2>&1 && mv $M/a3b.tmp.gguf $A) &
fi
part tests 50 python3 -m pytest -q -p no:cacheprovider tests/kernels/pdl
[ -n "$MADE" ] && small  # while the A3B file is made
wait_file $A $((BUDGET - 150))
B="python3 -m strata bench decode $A --device cuda --ctx 4096 --prompt-tokens 32 --tokens 64 --vram-budget 24"
part bench_sweep 110 $B --pdl-sweep 1,3,2,0
part check_a3b 50 python3 tools/device/pdl_check.py $A --tokens 32 --vram-budget 24 --modes 1,2,3
P="python3 tools/device/profile_decode.py $A --graphs on --steps 8 --top 14"
part profile_default 30 $P
part profile_pdl1 30 env STRATA_PDL=1 $P
part bench_pdl1 40 env STRATA_PDL=1 $B
[ -z "$MADE" ] && small
# 6. as time allows: the offloaded A3B (12 GiB, direct misses: the hits' and misses' GEMVs take PDL too)
part bench_offload 70 python3 -m strata bench decode $A --device cuda --ctx 4096 --prompt-tokens 32 --tokens 64 \
  --vram-budget 12 --gpu-floor bytes --pdl-sweep 1,3
{
  cat $L/times.txt
  tail -n 3 $L/tests.log
  for f in check_qwen3next check_qwen4exp check_a3b; do
    echo "=== $f"; grep -h "captured\|PASS\|FAIL\|Error\|graphs off" $L/$f.log | cut -c1-230
  done
  for f in bench_sweep bench_pdl1 bench_offload; do
    echo "=== $f"; grep -v "^\s*$\|Warning\|warn(" $L/$f.log 2>/dev/null | tail -n 12 | cut -c1-230
  done
  for f in profile_default profile_pdl1; do
    echo "=== $f"; grep -h "tok/s\|ms per token\|kernels per token\|_kernel" $L/$f.log | head -n 18 | cut -c1-160
  done
} > $OUT/pdl_summary.txt
cat $OUT/pdl_summary.txt
finish 12
