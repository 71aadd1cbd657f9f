#!/usr/bin/env bash
# Ready for session 15's first call (one H200, ~6 minutes: timeout_s 420; carry .whl and .devcache). Issue 4's 60 %
# of the HBM bound, after session 14's probe (BENCHMARKS, "Issue 4: what a decode step's launch structure allows"):
# a chain of kernels under PDL that load their whole weight share before their wait reads an A3B token at 86 % of
# the bound, the engine's step at 21.8 %. Which part of the engine's kernels costs it: the probe's chain reading
# GGUF's 18-byte Q4_0 blocks by 2-byte loads ("q4"), then doing the Q4_0 matvec's arithmetic on them ("q4dot"),
# beside the contiguous reads ("pdl"); then the engine's own A3B step all resident (bench decode and the per-kernel
# profile) on the same machine.
set -uo pipefail
BUDGET=${BUDGET:-400}
source tools/device/parts.sh || exit 1
A=$M/a3b.gguf
make_a3b_bg
P="python3 tools/device/megakernel_probe.py --reps 20"
part check 40 $P --check
part chains 90 $P --forms pdl,q4,q4dot --blocks 2048,4096,8192 --warps 4,8 --per-sm 1
wait_file $A 200
part decode_resident 90 python3 -m strata bench decode $A --device cuda --vram-budget 24 --ctx 4096 --tokens 64
part profile_resident 70 python3 tools/device/profile_decode.py $A --steps 8 --vram-budget 24
finish 40
