#!/usr/bin/env bash
# Session 10, first call: a streamed prompt's time split into copies and compute (issue 6 end to end); then, if
# PROBE=1, whether a bulk L2 prefetch hides a chain of small dependent reading kernels (issue 4). Logs are written
# into $OUT as they grow (a call cut short still returns them).
set -uo pipefail
BUDGET=${BUDGET:-300}
source tools/device/parts.sh || exit 1
L=$OUT
make_q4x12
part split_b7 200 python3 tools/device/stream_split.py $M/q4x12-00001-of-00002.gguf --tokens 4096 --vram-budget 7
[ "${PROBE:-0}" = 1 ] && part l2_probe 60 python3 tools/device/l2_prefetch_probe.py --mb 4.7,14,1
finish 40
