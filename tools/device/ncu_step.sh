#!/usr/bin/env bash
# A command's kernels under Nsight Compute, as session 20's first call ran them (the Firecracker machines read the
# counters; leave the clocks alone: --clock-control none): COUNT launches whose names match REGEX after SKIP of them
# (a captured step's graph nodes count one by one), with the throughput, issue, stall, occupancy, instruction and
# memory sections; the report as DIR/NAME.ncu-rep, its details page as DIR/NAME_details.log, and its table
# (ncu_table.py --merge) printed. Env for the command goes before it, as `env VAR=1 python3 ...`.
# Usage: bash tools/device/ncu_step.sh DIR NAME REGEX SKIP COUNT COMMAND...
#   e.g. part ncu 150 bash tools/device/ncu_step.sh $L default "regex:oneshot|decode_short" 2000 16 \
#          python3 -m strata bench decode $A3B --device cuda --vram-budget 24 --ctx 4096 --tokens 16
set -uo pipefail
dir=$1 name=$2 regex=$3 skip=$4 count=$5; shift 5
ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
  --section LaunchStats --section Occupancy --section InstructionStats --section MemoryWorkloadAnalysis \
  -k "$regex" --launch-skip "$skip" --launch-count "$count" -o "$dir/$name" "$@" || exit $?
ncu --import "$dir/$name.ncu-rep" --page details > "$dir/${name}_details.log" 2>&1
python3 "$(dirname "$0")/ncu_table.py" "$dir/${name}_details.log" --merge
