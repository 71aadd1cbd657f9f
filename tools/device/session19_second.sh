#!/usr/bin/env bash
# Ready for session 19 (one H200, ~9 minutes: timeout_s 580; carry .whl and .devcache). Issue 4's own command at 12
# GiB (experts behind the cache, misses read by the GPU from pinned RAM: `--misses direct`, captured as one graph, so
# decode runs one step ahead there too since session 18), plain loop (STRATA_DECODE_AHEAD=0) against ahead over two
# rounds, then ahead_check.py at 12 GiB and all resident (tokens plain against ahead, greedy and sampled, and their
# wall clocks; sampled now through the one-launch draw).
set -uo pipefail
BUDGET=${BUDGET:-450}
source tools/device/parts.sh || exit 1
make_a3b_bg && BUDGET=$((BUDGET + 60))
wait_file $A3B 240
AT12="python3 -m strata bench decode $A3B --device cuda --vram-budget 12 --ctx 4096 --tokens 256"
for round in 1 2; do
  part plain12_$round 90 env STRATA_DECODE_AHEAD=0 $AT12
  part ahead12_$round 90 $AT12
done
part check12 90 python3 tools/device/ahead_check.py $A3B --tokens 64 --vram-budget 12
# all resident: the sampled request's time with the one-launch draw (kernels/sample/draw.py, untimed in session 18;
# its torch form: plain 2.00, ahead 1.90 ms a token, greedy ahead 1.79)
part check24 60 python3 tools/device/ahead_check.py $A3B --tokens 64
finish 14
