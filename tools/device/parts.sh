# Sourced by the one-call device batches (session*.sh): wheels on the path, $M for models, $L for logs, and
# `part NAME CAP COMMAND...`, which runs COMMAND into $L/NAME.log under min(CAP, what is left of BUDGET) seconds,
# or says it was skipped when under 20 s are left; and `script NAME CAP`, which runs a branch's own batch
# tools/device/NAME.sh nested (its logs under $L/NAME) under min(CAP, what is left) seconds. The caller tars $L
# into $OUT (a call returns at most 8 files).
# A branch's script that sources this too, run by a batch with OUT=its own folder, finds everything set up: it
# installs nothing (installing the wheels again would replace packages under the other queue) and logs to $OUT/logs.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/models; mkdir -p $M
A3B=$M/a3b.gguf  # the A3B-shaped Q4_0 qwen3moe of issue 4's calls (`make_a3b_bg` makes it)
A3B_RESIDENT="python3 -m strata bench decode $A3B --device cuda --vram-budget 24 --ctx 4096 --tokens 64"  # all resident
if [ -n "${DEVICE_PARTS:-}" ]; then
  NESTED=1; L=$OUT/logs; mkdir -p $L
else
  L=/tmp/logs; mkdir -p $L
  source tools/device/wheels.sh || exit 1
  export DEVICE_PARTS=1
  export PYTHONUNBUFFERED=1
  # A part cut by its cap first gets SIGUSR1, which makes Python print every thread's stack into its log (where it
  # was stuck), then SIGKILL 5 s later.
  printf 'import faulthandler, signal\nfaulthandler.register(signal.SIGUSR1, all_threads=True)\n' > /tmp/site/sitecustomize.py
  # Compiled Triton kernels and numba code kept between device calls: a fresh machine compiles every kernel again
  # (seconds each, minutes for fla's autotuning). The batch tars .devcache into $OUT; copy those archives into
  # .devcache here and the next call carries them.
  mkdir -p .devcache && for f in .devcache/*.t?z; do [ -f "$f" ] && tar xaf "$f" -C .devcache && rm "$f"; done
  export TRITON_CACHE_DIR=$PWD/.devcache/triton NUMBA_CACHE_DIR=$PWD/.devcache/numba
fi
# One archive each, Triton's in two (by its kernels' hash's first character): a call returns files of at most 16 MB
# (session 4's single archive outgrew it; session 19's Triton one reached it and was left out).
save_cache() {
  [ -n "${NESTED:-}" ] && return
  XZ_OPT="-6 -T0" tar cJf "$OUT/cache_numba.txz" -C .devcache numba 2>/dev/null
  for half in A-P Q-Z2-7; do  # (base32 names: 16 characters each)
    (cd .devcache && ls -d triton/[$half]* 2>/dev/null) | XZ_OPT="-6 -T0" tar cJf "$OUT/cache_triton_$half.txz" \
      -C .devcache -T - 2>/dev/null
  done
  ls -la "$OUT"/cache_*.txz
}
part() {  # name cap command...
  local name=$1 cap=$2; shift 2
  local left=$((BUDGET - SECONDS)); [ "$left" -lt "$cap" ] && cap=$left
  if [ "$cap" -lt 20 ]; then echo "$name: skipped, out of time" | tee -a "$L/times.txt"; return; fi
  local t0=$SECONDS
  timeout -s USR1 -k 5 "$cap" "$@" > "$L/$name.log" 2>&1; echo "$name rc=$? in $((SECONDS - t0))s" | tee -a "$L/times.txt"
}
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; git log -1 --format=%h; } | tee "$L/gpu.txt"
script() {  # name cap: a branch's batch script nested, logging to $L/name (its own BUDGET, not the batch's)
  local name=$1 cap=$2; shift 2
  mkdir -p $L/$name
  local left=$((BUDGET - SECONDS)); [ "$left" -lt "$cap" ] && cap=$left
  OUT=$L/$name BUDGET=$((cap - 10)) timeout -k 5 $cap bash tools/device/$name.sh > $L/$name.log 2>&1
  echo "$name rc=$? by ${SECONDS}s" | tee -a $L/times.txt
}
finish() {  # [LINES]: a batch's end: its total time, the caches and logs into $OUT, the last lines of each log
  local lines=${1:-16}
  echo "total ${SECONDS}s" | tee -a $L/times.txt
  save_cache
  tar czf "$OUT/logs.tgz" -C $L .
  cat $L/times.txt
  for f in $L/*.log $L/*/logs/*.log; do
    [ -f "$f" ] || continue
    echo "=== $f"; grep -v "^\s*$" "$f" | grep -v "^-\{20\}" | grep -v "Warning\|warn_once\|^strata: \(loading\|reading\)" \
      | tail -n $lines | cut -c1-200
  done
}
summarize() {  # NAME PATTERN: a branch batch's end: its total time, the caches, its logs as $OUT/NAME_logs.tgz (nested:
  # none, the batch's archive holds $L), then each log's lines matching PATTERN (grep -E)
  echo "total ${SECONDS}s" | tee -a $L/times.txt
  save_cache
  [ -n "${NESTED:-}" ] || tar czf "$OUT/$1_logs.tgz" -C $L .
  cat $L/times.txt
  for f in $L/*.log; do
    echo "=== $f"
    grep -E "$2" "$f" | grep -v "^\s*$" | tail -n 40 | cut -c1-260
  done
}
make_q4x12() {  # the 12-layer full-size qwen4exp at $M/q4x12-00001-of-00002.gguf (~80 s) unless there; written aside,
  # the table shard moved into place first, so that a batch's other card waiting for the first shard finds both
  [ -f $M/q4x12-00001-of-00002.gguf ] && return
  mkdir -p $M/q4x12.tmp && part make_q4x12 110 python3 -m strata make-model --arch qwen4exp --preset full --layers 12 \
    -o $M/q4x12.tmp/q4x12.gguf && mv $M/q4x12.tmp/q4x12-00002-of-00002.gguf $M/ \
    && mv $M/q4x12.tmp/q4x12-00001-of-00002.gguf $M/
}
make_a3b_bg() {  # the A3B Q4_0 file at $A3B made in the background (~90 s) unless there or under way, written
  # aside and moved into place; true when it started one (callers may extend their BUDGET)
  [ -f $A3B ] || [ -f $M/a3b.tmp.gguf ] && return 1
  (python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 -o $M/a3b.tmp.gguf \
    > $L/make_a3b.log 2>&1 && mv $M/a3b.tmp.gguf $A3B) &
}
make_full_bg() {  # the full-size 48-layer qwen4exp at $FULL made in the background (~200 s, niced: parts run beside
  # it), unless there; `wait_file $FULL_MADE CAP` waits for it (the first shard appears before the file is whole)
  FULL=/tmp/q4x/full-00001-of-00002.gguf FULL_MADE=/tmp/q4x/made; mkdir -p /tmp/q4x
  [ -f $FULL_MADE ] && return
  (nice -n 10 python3 -m strata make-model --arch qwen4exp --preset full -o /tmp/q4x/full.gguf > $L/make_full.log 2>&1 \
    && touch $FULL_MADE) &
}
ab_rounds() {  # ROUNDS CAP "ARM ..." COMMAND...: COMMAND run in each .ab/ARM (a copy of the package there, which
  # `python3 -m` then imports), the arms alternating round by round so that the machine's drift falls on each;
  # logs ARM_ROUND
  local rounds=$1 cap=$2 arms=$3; shift 3
  for round in $(seq "$rounds"); do for arm in $arms; do part "${arm}_$round" "$cap" env -C ".ab/$arm" "$@"; done; done
}
arms_tokens() {  # BASE "ARM ...": each arm's greedy tokens and logits (tools/device/arm_tokens.py on $A3B, its own
  # package) saved, then each ARM's compared with BASE's; logs tokens_ARM and compare_ARM
  local base=$1 arm
  for arm in $base $2; do
    part tokens_$arm 40 env -C .ab/$arm python3 $PWD/tools/device/arm_tokens.py $A3B --save /tmp/tokens_$arm.pt
  done
  for arm in $2; do
    part compare_$arm 20 python3 tools/device/arm_tokens.py --compare /tmp/tokens_$base.pt /tmp/tokens_$arm.pt
  done
}
wait_file() {  # path cap: until the file is there (a model made in the background), at most until cap s into the batch
  while [ ! -f "$1" ] && [ $SECONDS -lt $2 ]; do sleep 2; done
}
