#!/usr/bin/env bash
# Session 10, first call: does a bulk L2 prefetch hide a chain of small dependent reading kernels (issue 4), and a
# streamed prompt's time split into copies and compute (issue 6 end to end).
set -uo pipefail
BUDGET=${BUDGET:-420}
source tools/device/parts.sh || exit 1
part l2_probe 90 python3 tools/device/l2_prefetch_probe.py --mb 4.7,14,1
make_q4x12
part split_b7 200 python3 tools/device/stream_split.py $M/q4x12-00001-of-00002.gguf --tokens 4096 --vram-budget 7
finish 40
