#!/usr/bin/env bash
# On the GPU machine: qwen4exp. (1) the tiny synthetic model on CUDA against the CPU (qwen4exp_check.py: float32
# within 1e-4, bf16 argmax agreement, prompt path = token-by-token decode, greedy tokens), then its decode through
# captured graphs against step by step (tokens, logits, tok/s both ways; PARTS=tiny stops here, under 2 minutes
# per part and 4 in all); (2) `make-model --preset
# full` at the real shapes (about 40 GB written + a 28.8 GB table shard that is a hole), its write rate, and
# `strata info` (expect "24,576 experts in 48 layers, 1,382,400 bytes each"); (3) `bench generate` on it (every
# expert resident on the H200; logits must stay finite through 48 layers); then the files are deleted.
# Needs ~45 GB of free disk under /tmp. Carry .whl (gguf, fla-core). Logs go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source tools/device/wheels.sh || exit 1
export PYTHONUNBUFFERED=1
DIR=$(mktemp -d /tmp/qwen4exp.XXXX)
trap 'rm -rf "$DIR"' EXIT
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; git rev-parse --short HEAD; df -h /tmp | tail -1; } \
  | tee "$OUT/qwen4exp_env.txt"
timeout 120 python3 tools/device/qwen4exp_check.py "$DIR" parity 2>&1 | tee "$OUT/qwen4exp_tiny_cuda.txt"
echo "tiny rc=${PIPESTATUS[0]}"
timeout 120 python3 tools/device/qwen4exp_check.py "$DIR" graphs 2>&1 | tee "$OUT/qwen4exp_tiny_graphs.txt"
echo "tiny graphs rc=${PIPESTATUS[0]}" | tee -a "$OUT/qwen4exp_tiny_graphs.txt"
[ "${PARTS:-all}" = tiny ] && exit 0
start=$(date +%s)
timeout 900 python3 -m strata make-model --arch qwen4exp --preset full -o "$DIR/full.gguf" > "$OUT/qwen4exp_full_make.txt" 2>&1
rc=$?; secs=$(( $(date +%s) - start ))
bytes=$(du -b --apparent-size "$DIR/full-00001-of-00002.gguf" | cut -f1)
echo "make-model full rc=$rc: $bytes bytes in ${secs}s = $(( bytes / 1000000 / (secs > 0 ? secs : 1) )) MB/s; disk used:" \
  "$(du -sh "$DIR" | cut -f1)" | tee -a "$OUT/qwen4exp_full_make.txt"
timeout 300 python3 -m strata info "$DIR/full-00001-of-00002.gguf" 2>&1 | tee "$OUT/qwen4exp_full_info.txt"
timeout 600 python3 -m strata bench generate "$DIR/full-00001-of-00002.gguf" --device cuda --prompt-tokens 1024 \
  --gen-tokens 16 --reps 1 --ctx 4096 2>&1 | tail -20 | tee "$OUT/qwen4exp_full_bench.txt"
