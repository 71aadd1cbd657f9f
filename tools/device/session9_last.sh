#!/usr/bin/env bash
# Session 9's measuring call (one H200), the three branches merged: the parts of fusedx.sh, chain.sh and dma.sh that
# decide defaults, within one call's time.
#   (Branch fusedx was not merged after this call: its parts below need that branch.)
#   fusedx: the fused sweep at 16K tokens over the first six new shapes (register-operand "t", "r") beside the
#     default, each line within the tool's bounds or not; the new kernels' CUDA tests.
#   chain: A3B all resident, bench decode with STRATA_DECODE_CHAIN off and on; chain_check.py's bytes.
#   dma / early: 12 full-size qwen4exp layers at 7 GiB (a two-layer ring), balanced routing, 4K: gather, gather
#     with STRATA_PF_EARLY, dma with it; check_prefill_stream.py under dma + early.
set -uo pipefail
BUDGET=${BUDGET:-480}
source tools/device/parts.sh || exit 1
A=$M/a3b.gguf
[ -f $A ] || (python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 -o $M/a3b.tmp.gguf \
  > $L/make_a3b.log 2>&1 && mv $M/a3b.tmp.gguf $A) &
make_q4x12 &
Q="python3 -m strata.bench.moe_prefill --only Q2_0/Q2_0 --paths fused"
SHAPES=$(python3 -c "from strata.bench.moe_prefill import FUSED_SWEEP; print(','.join(FUSED_SWEEP[:6]))")
part fusedx_16k 120 $Q --tokens 16384 --sweep "$SHAPES" --reps 3
part fusedx_tests 50 python3 -m pytest -q -p no:cacheprovider tests/kernels/moe/test_fused_q2_0_regs.py
wait
B="python3 -m strata bench decode $A --device cuda --ctx 4096 --prompt-tokens 32 --tokens 64"
part decode_off 40 env STRATA_DECODE_CHAIN= $B
part decode_chain 40 env STRATA_DECODE_CHAIN=1 $B
part chain_check 45 python3 tools/device/chain_check.py $A --tokens 24 --configs 1
F=$M/q4x12-00001-of-00002.gguf
P="python3 -m strata bench prompt $F --device cuda --vram-budget 7 --ctx 4096 --routing balanced --reps 1"
part prompt_gather 45 $P
STRATA_PF_EARLY=1 part prompt_gather_early 45 $P
STRATA_PF_STREAM=dma STRATA_PF_EARLY=1 part prompt_dma_early 45 $P
STRATA_PF_STREAM=dma STRATA_PF_EARLY=1 part check_dma_early 50 python3 tools/device/check_prefill_stream.py
summarize last "x default|ms |within|OUT OF|passed|failed|tok/s|GPU step|HBM|PASS|FAIL|ALL OK|equal|differ|PCIe floor|Error"
