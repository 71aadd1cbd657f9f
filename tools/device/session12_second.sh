#!/usr/bin/env bash
# Session 12's second call (one H200, ~9 minutes: timeout_s 590; carry .whl and .devcache). Issue 6: is "the form
# that ran first on a freshly made file was slower" the kernel still writing the new file back to disk? The first call
# ran dma first again and it was the slower (4K 1.68x, 32K 1.48x; gather after it 1.59x / 1.65x), with the forwards
# waiting only 80 ms a prompt for cold n-gram rows. Here the file's dirty pages are counted every 5 s throughout, and
# written out (`sync`, timed) before any bench; then issue 6's command by dma, by gather, and by dma again; then
# chunk_probe's 4K prompt layer by layer (cold rows, then the same prompt again).
set -uo pipefail
BUDGET=${BUDGET:-540}
source tools/device/parts.sh || exit 1
(while sleep 5; do echo "$SECONDS $(grep -E '^(Dirty|Writeback):' /proc/meminfo | tr -s ' ' | tr '\n' ' ')"; done) \
  > $L/dirty.log 2>&1 &
make_full_bg; F=$FULL
{ df -T /tmp; free -g; } > $L/host.log 2>&1
wait_file $FULL_MADE 260
{ echo "made by ${SECONDS}s"; grep -E '^(Dirty|Writeback|Cached|MemFree):' /proc/meminfo; t0=$SECONDS; sync
  echo "sync took $((SECONDS - t0)) s"; grep -E '^(Dirty|Writeback):' /proc/meminfo; } >> $L/host.log 2>&1
P="python3 -m strata bench prompt $F --device cuda --vram-budget 12 --ctx 4096,32768 --routing balanced --reps 2"
part prompt_dma 100 $P
STRATA_PF_STREAM=gather part prompt_gather 95 $P
part prompt_dma2 100 $P
part probe_4k 70 python3 tools/device/chunk_probe.py $F --tokens 4096 --vram-budget 12 --forms dma --per-layer --seed 7
finish 40
