#!/usr/bin/env bash
# One device call (session 4, first): the long-context backlog (issue 5: qsa.sh's selection / Quest / kv-resident
# tests on CUDA, then `bench long-context` at 32K on small qwen3 and qwen3next), qwen4exp's tiny captured decode
# (issue 3) and gdn.sh (fla's GDN at Qwen3-Next size, tiny Qwen3-Next on CUDA against transformers). Parts in
# priority order, each capped by tools/device/parts.sh; carry .whl; logs come back as one tarball.
set -uo pipefail
BUDGET=${BUDGET:-540}
source tools/device/parts.sh || exit 1
part qsa_tests 150 python3 -m pytest -q -p no:cacheprovider tests/engine/test_kv_selection.py \
  tests/engine/test_quest.py tests/engine/test_kv_resident.py tests/kernels/select/test_quest.py
python3 -m strata make-model --arch qwen3 --preset small --quant Q8_0 -o $M/small-qwen3.gguf >/dev/null
python3 -m strata make-model --arch qwen3next --preset small --quant Q8_0 -o $M/small-next.gguf >/dev/null
part long_qwen3_32k 120 python3 -m strata bench long-context $M/small-qwen3.gguf --device cuda --prompt-tokens 32768 \
  --gen-tokens 16 --resident 8192
part qwen4exp_graphs 60 python3 tools/device/qwen4exp_check.py $M graphs
part gdn 130 bash tools/device/gdn.sh
part long_next_32k 100 python3 -m strata bench long-context $M/small-next.gguf --device cuda --prompt-tokens 32768 \
  --gen-tokens 16 --resident 8192
echo "total ${SECONDS}s"
cp $OUT/*.txt $L/ 2>/dev/null
tar czf "$OUT/logs.tgz" -C $L .
cat $L/times.txt
for f in $L/*.log; do echo "=== $f"; grep -v "^\s*$" "$f" | grep -v "^-\{20\}" | tail -n 14 | cut -c1-200; done
