#!/usr/bin/env bash
# On the GPU machine's host CPU (16 cores): the CPU expert pool's kernels. The SIMD kernel tests (every ISA variant
# the CPU runs, bit-identical, within the float64 bound); one core's compute rate of every row kernel
# (`--row-kernels`); then `strata bench cpu-experts` with calls cycling over 512 MB of weights: 40 missed experts (a
# layer of the all-CPU baseline) and 2 (what a decode step at --vram-budget 12 misses per layer), the pool's default
# threads (every core but one) and all 16, static and dynamic chunks.
# Run from the repo root with .whl carried (gguf); logs to $OUT (4 files); under 3 minutes.
set -uo pipefail
source tools/device/wheels.sh || exit 1
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{ lscpu | grep -E "^(Model name|CPU\(s\)|Thread|Core|Socket|L3|NUMA node\(s\))"
  lscpu | grep -o -w -E "avx2|avx512f|avx512vl|avx512_vnni|avx_vnni|amx_int8" | sort -u | tr '\n' ' '; echo
  git rev-parse --short HEAD 2>/dev/null
  python3 -c "import numba, llvmlite.binding as l, numpy; print('numba', numba.__version__, 'llvm', l.llvm_version_info, 'numpy', numpy.__version__)"
  timeout 60 python3 -c "from strata.engine.cpu_kernels.simd_pool import ISA; print('SIMD variant', ISA)"
} 2>&1 | tee "$OUT/cpu_pool_env.txt"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/engine/test_cpu_simd.py tests/engine/test_cpu_kernels.py 2>&1 \
  | tail -15 | tee "$OUT/cpu_pool_tests.txt"
rc=${PIPESTATUS[0]}
brc=0
bench() {  # $1: label, then the bench's options
  local label=$1; shift
  echo "== $label: bench cpu-experts $*" | tee -a "$OUT/cpu_pool_bench.txt"
  timeout 75 python3 -m strata bench cpu-experts --reps 3 --footprint-mb 512 "$@" 2>&1 | tee -a "$OUT/cpu_pool_bench.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || brc=1
}
bench "one core, row kernels in cache" --row-kernels
bench "40 experts, pool threads" --experts 40
bench "2 experts, pool threads" --experts 2 --formats Q4_0,Q4_K,Q8_0
bench "40 experts, 16 threads" --experts 40 --threads 16 --formats Q4_0,Q4_K
bench "2 experts, 16 threads, dynamic chunks" --experts 2 --threads 16 --chunksize 1 --formats Q4_0,Q4_K
echo "tests rc=$rc bench rc=$brc" | tee -a "$OUT/cpu_pool_env.txt"
[ "$rc" = 0 ] && [ "$brc" = 0 ]
