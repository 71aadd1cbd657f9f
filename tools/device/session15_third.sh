#!/usr/bin/env bash
# Session 15's third call (one H200, ~3 minutes; carry .whl and .devcache). Issue 4: Q4_0 rows split for 16-byte
# code loads (kernels/quant/q4_0_split.py) against the engine's GGUF-row matvec, an A3B layer's four matvecs in a
# chain of 48 layers under PDL (tools/device/split_probe.py); the split kernel's CUDA tests first.
set -uo pipefail
BUDGET=${BUDGET:-200}
source tools/device/parts.sh || exit 1
part tests 60 python3 -m pytest -q -x tests/kernels/quant/test_q4_0_split.py
part probe 150 python3 tools/device/split_probe.py --dp4a-tiles ${DP4A_TILES:-8x4,16x4,32x4,32x8,16x8}
finish 40
