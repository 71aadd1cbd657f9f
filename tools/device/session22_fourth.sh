#!/usr/bin/env bash
# Session 22's fourth call (one H200, ~7 minutes: timeout_s 450; carry .whl and .devcache): the third call's whole
# suite on the GPU machine again, naming each test as it ends (-v) and failing a test that runs past 90 s
# (pytest-timeout) instead of waiting on it (the third call's run stopped at 94 % with about twelve failures).
set -uo pipefail
BUDGET=${BUDGET:-430}
source tools/device/parts.sh || exit 1
part tests_all 400 python3 -m pytest -v -n 14 --timeout=90 -rfE -p no:cacheprovider tests --ignore=tests/serve
grep -E "FAILED|ERROR|Timeout" $L/tests_all.log | grep -v "^E " | cut -c1-220 | sort | uniq | head -60 > $L/failed.txt
finish 80
