#!/usr/bin/env bash
# One device call (session 3, first): the A3B-shape decode profile (one captured replay's kernels, and step by step),
# then the small runs never made on a GPU: speculation on the small and default models, conversation checkpoints on
# small models, the tiny qwen4exp on CUDA against the CPU, and the qwen3next rows of the captured-decode check.
# Each part is capped; a part that would start past BUDGET seconds is skipped and says so. Carry .whl; logs in $OUT.
set -uo pipefail
BUDGET=${BUDGET:-560}
source tools/device/parts.sh || exit 1
part make_a3b 150 python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 -o $M/a3b.gguf
part profile_graphs 100 python3 tools/device/profile_decode.py $M/a3b.gguf --graphs on --steps 8
part profile_eager 70 python3 tools/device/profile_decode.py $M/a3b.gguf --graphs off --steps 4
part graphs_qwen3next 80 python3 tools/device/decode_graphs_check.py $M 32 qwen3next
part qwen4exp_tiny 90 python3 tools/device/qwen4exp_check.py $M
part spec_small 120 bash -c "python3 -m strata make-model --arch qwen3next --preset small --quant Q4_K --mtp \
  -o $M/next-small.gguf && python3 -m strata bench spec $M/next-small.gguf --device cuda --prompt-tokens 256 \
  --gen-tokens 64 && python3 -m strata bench spec $M/next-small.gguf --device cuda --prompt-tokens 256 \
  --gen-tokens 64 --suffix-draft 3"
D=strata/data/default-model/strata-default-qwen3next-q8_0.gguf
part spec_default 100 python3 -m strata bench spec $D --device cuda --prompt-tokens 256 --gen-tokens 128
part checkpoints 90 bash -c "python3 -m strata make-model --arch qwen3moe --preset small --quant Q4_K -o $M/small.gguf \
  && python3 -m strata bench checkpoints $M/small.gguf --device cuda --prompt-tokens 4096 \
  && python3 -m strata bench checkpoints $M/small.gguf --device cuda --prompt-tokens 4096 --kv-dtype int8 \
  && python3 -m strata bench checkpoints $M/graphs-qwen3next-small-Q4_0.gguf --device cuda --prompt-tokens 4096"
echo "total ${SECONDS}s"
tar czf "$OUT/logs.tgz" -C $L .
for f in $L/*.log; do echo "=== $f"; grep -v "^\s*$" "$f" | tail -n 25; done
