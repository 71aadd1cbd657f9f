#!/usr/bin/env bash
# Prepared at the end of session 7 for the next session's first call, two H200s (nvidia-h200-x2); carry .whl and
# .devcache. Under 9 minutes. What session 7 left unmeasured on the GPU:
# Card 0: branch pfstream2's changes after its checkpoint (tools/device/pfstream2.sh: gather tests, streamed ==
#   resident, the gather sweep, per-layer streaming host time, the refill's bytes); then why the full-size qwen4exp's
#   32K prompt ran 2x slower with the int8 KV cache than with fp16 (1,213 vs 2,476 tok/s): the same 12 layers,
#   32K tokens, both caches, device time by op and call site.
# Card 1: imma's launch shapes at the two short-context shapes (split-K, queries a program), the int8 matrix
#   rate at several shapes (tools/device/int8_rates.py); branch missbw's sweep of the misses' in-place tiles (cut in session 7; tools/device/missbw.sh); then the
#   A3B all-resident step (2.10 ms in session 7's middle call, 2.24-2.25 ms in its last two): bench decode and the
#   step's kernels (profile_decode.py) to say which kernel moved.
set -uo pipefail
BUDGET=${BUDGET:-540}
source tools/device/parts.sh || exit 1
(export CUDA_VISIBLE_DEVICES=0
 script pfstream2 330
 F=$M/q4x12-00001-of-00002.gguf
 P="python3 tools/device/profile_prompt.py $F --tokens 32768 --rows 25 --stacks"
 part profile32k_fp16 90 $P --kv-dtype float16
 part profile32k_int8 90 $P --kv-dtype int8) &
(export CUDA_VISIBLE_DEVICES=1
 (python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b --quant Q4_0 -o $M/a3b.tmp.gguf \
   > $L/make_a3b.log 2>&1 && mv $M/a3b.tmp.gguf $M/a3b.gguf) &
 script missbw 200
 S="python3 -m strata bench prompt-attn --variants imma --reps 5 --sweep q1h0c32w4s2t2p16r128x1g1u1a1o1 q1h0c32w4s2k2t2p16r128x1g1u1a1o1 q1h0c32w4s2k3t2p16r128x1g1u1a1o1 q1h0c32w4s2k4t2p16r128x1g1u1a1o1 q2h0c32w4s2t2p16r128x1g1u1a1o1 q2h0c32w4s2k2t2p16r128x1g1u1a1o1 q1h0c32w4s2t2p16r128x1g1u1o1 q1h0c32w4s2k2t2p16r128x1g1u1o1 q1h0c64w4s2t2p16r128x1g1u1a1o1 q1h0c32w8s2t2p16r128x1g1u1a1o1"
 part imma_short_1500 80 $S --ctx 1500 --queries 1500
 part imma_short_2100 70 $S --ctx 2100 --queries 256
 part int8_rates 30 python3 tools/device/int8_rates.py
 while [ ! -f $M/a3b.gguf ] && [ $SECONDS -lt 400 ]; do sleep 2; done
 part a3b_resident 40 python3 -m strata bench decode $M/a3b.gguf --device cuda --ctx 4096 --prompt-tokens 32 \
   --tokens 64 --vram-budget 24
 part a3b_profile 40 python3 tools/device/profile_decode.py $M/a3b.gguf --graphs on --steps 8 --top 14) &
wait
finish 20
