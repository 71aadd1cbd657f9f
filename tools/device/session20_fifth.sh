#!/usr/bin/env bash
# Session 20's fifth call (one H200, ~6 minutes: timeout_s 420; carry .whl, .ab and .devcache). Issue 4: a decode
# step's inputs in one launch each, the token embedding's rows (kernels/pointwise/embed_rows.py: Q4_0 / Q8_0 /
# float rows dequantized in the gather, the same bytes) and the RoPE cos / sin rows (rope_cos_sin.py, one launch
# for torch's seven); tools/count_step_kernels.py --fused on the tiny Q4_0 qwen3moe: 40 -> 23 launches a token.
# Arms alternating (A3B all resident, fp16 KV):
#   base    .ab/base (HEAD's package: the routing top-k over int32 bits)
#   inputs  .ab/inputs (the working tree's package)
# Make the arms: rm -rf .ab && mkdir -p .ab/base .ab/inputs && git archive HEAD strata ':!strata/data' | tar -x -C
#   .ab/base && (git ls-files -co --exclude-standard strata | grep -v ^strata/data | tar -cf - -T - | tar -xf - -C .ab/inputs)
# then the kernels' CUDA tests (the embedding's bytes equal torch's), the tiny qwen4exp's captured decode against
# step by step, the step's increments, and issue 4's 12 GiB command on the working tree.
set -uo pipefail
BUDGET=${BUDGET:-360}
source tools/device/parts.sh || exit 1
make_a3b_bg && BUDGET=$((BUDGET + 60))
part tests_inputs 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/pointwise/test_step_inputs.py
Q=$(mktemp -d /tmp/s20-q4.XXXX)
part graphs_qwen4exp 60 python3 tools/device/qwen4exp_check.py $Q graphs
wait_file $A3B 240
ab_rounds 2 30 "base inputs" $A3B_RESIDENT
part inc_inputs 40 python3 tools/device/profile_decode.py $A3B --steps 8 --vram-budget 24 --increments
part budget12 60 python3 -m strata bench decode $A3B --device cuda --vram-budget 12 --ctx 4096 --tokens 256
finish 10
