#!/usr/bin/env bash
# On the GPU machine: train the small default model (tools/train_small.py: Qwen3-Next MoE + MTP head, transformers'
# own classes, bf16 autocast, fla-core's GDN kernels), export it to Q8_0 GGUF, and check it with our engine.
# Before: on the CPU machine, `python tools/train_small.py prepare --out .train` (apt-get fetches two Debian doc
# packages; ~1 min). Carry [".whl", ".train"]; .whl needs gguf, fla-core, einops, transformers and its pure-Python
# deps (see the report of issue 9). About 7 minutes: TRAIN_SECONDS (default 300) of training, the rest start-up,
# evaluation and export (TRAIN_ARGS adds options: a CPU dry run uses "--preset tiny --max-steps 3"). Everything lands in $OUT/trained (checkpoint/, model.gguf, result.json, train_log.jsonl).
set -uo pipefail
source tools/device/wheels.sh || exit 1
# fla-core 0.6's GDN backward refuses Triton 3.4-3.7.0 on Hopper (wrong results, its issue #640): training uses
# transformers' torch form of the gated delta rule instead (inference keeps fla's forward kernels elsewhere).
rm -rf /tmp/site/fla /tmp/site/fla_core-*
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -f .train/train.bin ] || { echo "no .train/train.bin: run 'python tools/train_small.py prepare --out .train' first and carry .train"; exit 2; }
{
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  git rev-parse --short HEAD 2>/dev/null
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
  python3 -c "import fla; print('fla-core', fla.__version__)" 2>&1 | tail -1
  sha256sum .train/train.bin .train/heldout.bin .train/tokenizer_gguf.json
} 2>&1 | tee "$OUT/train_env.txt"
timeout 480 python3 tools/train_small.py train --data .train --out "$OUT/trained" --time-limit "${TRAIN_SECONDS:-300}" \
  ${TRAIN_ARGS:-} 2>&1 | grep -v '^{"event": "step"' | tee "$OUT/train_small.txt"
[ -f "$OUT/trained/model.gguf" ] || { echo "training wrote no GGUF"; exit 1; }
# Our engine on the exported file: held-out perplexity against transformers' (OK within 1 %), greedy samples.
timeout 60 python3 tools/train_small.py check --run "$OUT/trained" --device "${CHECK_DEVICE:-cuda}" 2>&1 | tail -1 | tee "$OUT/train_check.txt"
timeout 60 python3 tools/train_small.py check --run "$OUT/trained" --device cpu 2>&1 | tail -1 | tee -a "$OUT/train_check.txt"
# Files come back at most 16 MiB each and 8 in all: one tar of the run in 15 MiB parts, the checkpoint's weights
# in it as a bfloat16 copy (the float32 file is 4 bytes a parameter, too large to return).
python3 - "$OUT/trained/checkpoint" <<'PY'
import sys
from safetensors.torch import load_file, save_file
import torch
folder = sys.argv[1]
tensors = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in load_file(f"{folder}/model.safetensors").items()}
save_file(tensors, f"{folder}/model.bf16.safetensors", metadata={"format": "pt"})
PY
du -sh "$OUT/trained"/* "$OUT/trained/checkpoint"/* | tee -a "$OUT/train_check.txt"
(cd "$OUT" && tar cf - --exclude=trained/checkpoint/model.safetensors trained | split -b 15M - trained.tar.part- \
  && rm -rf trained && ls -la)
echo "unpack: cat trained.tar.part-* | tar xf -   (then: python tools/train_small.py ship --run trained)"
