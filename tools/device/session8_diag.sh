#!/usr/bin/env bash
# Session 8: why the tiny qwen4exp's decode graphs fail to capture on the H200 (third call: "capture failed
# (RuntimeError: it->second->use_count > 0 INTERNAL ASSERT FAILED ... CUDACachingAllocator.cpp)", also with
# STRATA_PDL=0), while the full-size file and qwen3next capture. The capture failure now names the exception that
# started it. One H200, the variants side by side (no timing): default, each of this session's switches off.
set -uo pipefail
BUDGET=${BUDGET:-110}
source tools/device/parts.sh || exit 1
T=$M/q4x-tiny-00001-of-00002.gguf
python3 -m strata make-model --arch qwen4exp --preset tiny --quant Q8_0 -o $M/q4x-tiny.gguf > $L/make_tiny.log 2>&1
B="python3 -m strata bench decode $T --device cuda --ctx 512 --prompt-tokens 32 --tokens 8"
part default 80 $B &
STRATA_PDL=0 part pdl0 80 $B &
STRATA_NGRAM_SYNC=1 part ngram_sync 80 $B &
STRATA_QSA_DENSE_MASK=1 part dense_mask 80 $B &
STRATA_PDL=0 STRATA_NGRAM_SYNC=1 STRATA_QSA_DENSE_MASK=1 part all_off 80 $B &
part short_prompt 80 python3 -m strata bench decode $T --device cuda --ctx 512 --prompt-tokens 2 --tokens 8 &
wait
finish 12
