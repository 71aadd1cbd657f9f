#!/usr/bin/env bash
# On the GPU machine (issue 6, branch dma): a prompt's missing experts streamed by the copy engines
# (STRATA_PF_STREAM=dma: runs of experts consecutive in the stacks and the slots, three cudaMemcpy2DAsync a run, no
# SM) against the gather kernel (the default, gather) and the gather kernel on the highest-priority stream (gather-hi).
# 1. Tests: the copy engines' bytes == the reference (tests/engine/test_copy_runs.py; its GPU test fails if torch's
#    fallback ran instead of the runtime's cudaMemcpy2DAsync).
# 2. `strata bench expert-gather` at 64/256/512 experts with ~12 % of the layer present between them: GB/s alone vs
#    the pinned rate, host us a batch, how much a bf16 product beside it slows, the copy's rate beside the product.
# 3. The 12-layer full-size qwen4exp at --vram-budget 7 (2,568 slots: a two-layer ring, as the 48-layer file at 12
#    GiB; 4.4 GiB lends a one-layer ring, 90 % late, serialised by construction), balanced routing (a trained model's
#    load: every chunk streams every expert the cache lacks), 4K and 32K, under each form: "x the PCIe floor" is the
#    goal's figure (1.5x; gather at 7 GiB: 2.35x at 4K, 2.14x at 16K).
#    Forms: dma, gather (today's default), then each with STRATA_PF_EARLY=1 (the next layer's copy queued before this
#    layer's routing read, late misses on a second copy stream: for the ~6.5 ms of idle link a layer in the timeline).
# 4. check_prefill_stream.py under dma + early: streamed logits bytes == all-resident.
# 5. profile_prompt.py --timeline under dma + early (4K, the same load): copies against compute, link idle gaps.
# 6. gather-hi's and dma1d's prompts while the budget lasts.
# Run from the repo root with .whl (and .devcache) carried; logs come back as one tarball; about 6 minutes.
set -uo pipefail
BUDGET=${BUDGET:-400}
source tools/device/parts.sh || exit 1
F=$M/q4x12-00001-of-00002.gguf
make_q4x12 &
part dma_tests 45 python3 -m pytest -q -p no:cacheprovider tests/engine/test_copy_runs.py
part gather_bench 80 python3 -m strata bench expert-gather --experts 64,256,512  # beside make_q4x12: host us high
wait
B="python3 -m strata bench prompt $F --device cuda --vram-budget 7 --ctx 4096,32768 --routing balanced --reps 1"
STRATA_PF_STREAM=dma part prompt_dma 100 $B  # the first: cold compiles too
part prompt_gather 70 $B
STRATA_PF_STREAM=dma STRATA_PF_EARLY=1 part prompt_dma_early 70 $B
STRATA_PF_STREAM=dma STRATA_PF_EARLY=1 part check_stream_dma_early 60 python3 tools/device/check_prefill_stream.py
STRATA_PF_EARLY=1 part prompt_gather_early 70 $B
P="python3 tools/device/profile_prompt.py $F --vram-budget 7 --routing balanced --rows 8 --tokens 4096 --timeline"
STRATA_PF_STREAM=dma STRATA_PF_EARLY=1 part timeline_dma_early 90 $P
STRATA_PF_STREAM=gather-hi part prompt_gather_hi 70 $B
STRATA_PF_STREAM=dma1d part prompt_dma1d 60 $B
summarize dma "timeline|link idle|experts \(|gather|dma|copies|copy calls|pinned|tok/s|PCIe floor|streaming host|streamed by|PASS|FAIL|ALL OK|passed|failed|Error"
