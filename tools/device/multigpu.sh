#!/usr/bin/env bash
# Layer split across cards (issue 8). On any one-GPU machine: the split as `--gpus 0,0` (two pipeline stages on one
# card, each on its own stream; checks the transport, the wavefront and each stage's caches, not speed) against one
# card: tokens and logits per architecture and split (tools/device/multigpu_check.py), then `strata bench prompt` /
# `bench decode` through --gpus 0,0 so the CLI paths run on CUDA. With two or more GPUs visible: `strata bench
# prompt` and `bench decode` with --gpus 0,1 against one card at the same total --vram-budget (Qwen3-30B-A3B shape,
# Q4_0; experts offloaded: BUDGET GiB per card vs 2 x BUDGET on one; ALL=1 adds all resident; PREFILL sets the
# prompt chunk; CHECK=0 skips the parity check); ONE=1 forces the one-card part. Run from the repo root with .whl carried (gguf); logs to $OUT (a
# tarball + summary.txt); each part under 8 minutes.
set -uo pipefail
source tools/device/wheels.sh || exit 1
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/models; mkdir -p $M; L=/tmp/multigpu_logs; mkdir -p $L
BUDGET=${BUDGET:-8}
PREFILL=${PREFILL:-auto}  # e.g. 1024: several chunks of a 4096-token prompt in flight across the cards
N=$(nvidia-smi -L | wc -l)
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; git rev-parse --short HEAD 2>/dev/null; echo "gpus $N"; } \
  2>&1 | tee "$OUT/summary.txt"
if [ "$N" -lt 2 ] || [ "${ONE:-0}" = 1 ]; then
  timeout 60 python3 -m pytest -q tests/engine/test_pipeline.py tests/engine/test_placement_split.py 2>&1 | tail -2 \
    | tee -a "$OUT/summary.txt"
  timeout 260 python3 tools/device/multigpu_check.py $M 0,0 > $L/check_0_0.txt 2>&1; echo "check 0,0 rc=$?" | tee -a "$OUT/summary.txt"
  grep -E "PASS|FAIL" $L/check_0_0.txt | tee -a "$OUT/summary.txt"
  S=$M/split-qwen3moe.gguf
  timeout 60 python3 -m strata info $S --plan --gpus 0,0 --vram-budget 2 2>&1 | tail -8 | tee $L/info_plan.txt
  timeout 60 python3 -m strata bench prompt $S --gpus 0,0 --ctx 2048 > $L/bench_prompt_0_0.txt 2>&1
  echo "bench prompt 0,0 rc=$?" | tee -a "$OUT/summary.txt"
  timeout 60 python3 -m strata bench decode $S --gpus 0,0 --tokens 32 > $L/bench_decode_0_0.txt 2>&1
  echo "bench decode 0,0 rc=$?" | tee -a "$OUT/summary.txt"
  grep -hE "tok/s" $L/bench_prompt_0_0.txt $L/bench_decode_0_0.txt | tee -a "$OUT/summary.txt"
else  # two or more cards: parity across real cards (CHECK=0 skips it), then the speed comparison at the same budget
  if [ "${CHECK:-1}" = 1 ]; then
    timeout 160 python3 tools/device/multigpu_check.py $M 0,1 > $L/check_0_1.txt 2>&1; echo "check 0,1 rc=$?" | tee -a "$OUT/summary.txt"
    grep -E "PASS|FAIL" $L/check_0_1.txt | tee -a "$OUT/summary.txt"
  fi
  [ -f $M/a3b.gguf ] || timeout 180 python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 -o $M/a3b.gguf > /dev/null 2>&1
  TWO=$(python3 -c "print(2 * $BUDGET)")
  PAIRS=("--device cuda:0 --vram-budget $TWO|one card" "--gpus 0,1 --vram-budget $BUDGET|two cards")
  [ "${ALL:-0}" = 1 ] && PAIRS+=("--device cuda:0|one card, all resident" "--gpus 0,1|two cards, all resident")
  for pair in "${PAIRS[@]}"; do
    opts=${pair%%|*}; name=${pair##*|}
    echo "== $name: $opts" | tee -a $L/bench_two.txt "$OUT/summary.txt"
    timeout 60 python3 -m strata bench prompt $M/a3b.gguf $opts --ctx 4096 --prefill $PREFILL 2>&1 | tee -a $L/bench_two.txt | grep "tok/s" | tee -a "$OUT/summary.txt"
    timeout 40 python3 -m strata bench decode $M/a3b.gguf $opts --tokens 32 2>&1 | tee -a $L/bench_two.txt | grep "^decode" | tee -a "$OUT/summary.txt"
  done
fi
tar -czf "$OUT/multigpu_logs.tgz" -C $L .
