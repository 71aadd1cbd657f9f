# Sourced by the one-call device batches (session*.sh): wheels on the path, $M for models, $L for logs, and
# `part NAME CAP COMMAND...`, which runs COMMAND into $L/NAME.log under min(CAP, what is left of BUDGET) seconds,
# or says it was skipped when under 20 s are left. The caller tars $L into $OUT (a call returns at most 8 files).
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/models; mkdir -p $M
L=/tmp/logs; mkdir -p $L
source tools/device/wheels.sh || exit 1
export PYTHONUNBUFFERED=1
part() {  # name cap command...
  local name=$1 cap=$2; shift 2
  local left=$((BUDGET - SECONDS)); [ "$left" -lt "$cap" ] && cap=$left
  if [ "$cap" -lt 20 ]; then echo "$name: skipped, out of time" | tee -a "$L/times.txt"; return; fi
  local t0=$SECONDS
  timeout "$cap" "$@" > "$L/$name.log" 2>&1; echo "$name rc=$? in $((SECONDS - t0))s" | tee -a "$L/times.txt"
}
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; git log -1 --format=%h; } | tee "$L/gpu.txt"
