#!/usr/bin/env bash
# Session 6: where the full-size qwen4exp's time goes, on 4 of its 48 layers (make-model --layers 4: the real
# shapes, written in a fraction of the full file's 214 s): the captured decode step profiled, then a 4,096-token
# prompt profiled, all resident. Carry .whl and .devcache.
set -uo pipefail
BUDGET=${BUDGET:-300}
source tools/device/parts.sh || exit 1
part make_q4x4 120 python3 -m strata make-model --arch qwen4exp --preset full --layers 4 -o $M/q4x4.gguf
F=$M/q4x4-00001-of-00002.gguf
part decode 60 python3 tools/device/profile_decode.py $F --graphs on --steps 8 --top 40
part prompt 90 python3 tools/device/profile_prompt.py $F --tokens 4096 --rows 40
save_cache
tar czf "$OUT/logs.tgz" -C $L .
cat $L/times.txt
for f in $L/decode.log $L/prompt.log; do echo "=== $f"; grep -v "^\s*$" "$f" | grep -v "^-\{20\}" | head -n 60 | cut -c1-180; done
