#!/usr/bin/env bash
# Session 22's second call (one H200, ~9 minutes: timeout_s 590; carry .whl and .devcache): the whole CUDA kernel
# suite (tests/kernels, every kernel on the GPU at its test sizes against its reference), twelve pytest workers so
# that Triton's compiles run side by side (the first call's single process reached a quarter of it in 205 s).
set -uo pipefail
BUDGET=${BUDGET:-560}
source tools/device/parts.sh || exit 1
part tests_kernels 520 python3 -m pytest -q -n 12 -rfE -p no:cacheprovider tests/kernels
finish 30
