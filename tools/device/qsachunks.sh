#!/usr/bin/env bash
# On the GPU machine (issue 6, qsafp16's task 2): why the offloaded full-size qwen4exp's 32K prompt ran 2x slower
# with the int8 KV cache (6 chunks of 5,461 tokens, 1,128 borrowed work slots) than with fp16, while all resident the
# int8 cache was 1.9x faster. 12 full-size layers at --vram-budget 4.4 (as 48 layers at 12 GiB), 32,768 tokens:
# 1. prompt_chunks_check.py: per chunk wall ms, streamed MiB (late share), host + routing wait a layer, the work
#    arena's high water / overflow, the allocator's retries; fp16, int8, int8 without borrowing, int8 in chunks of
#    4,096. A cause in the chunk size or the borrowing shows as int8's rows alone being slow.
# 2. The int8 prompt again under cProfile: the host's time by function (the slow run's streamer accounted for only
#    ~7 ms of ~94 ms a layer: a blocking read elsewhere shows with its caller).
# 3. profile_prompt.py, int8 at 4.4 GiB: kernels by device time, host ops by self time.
# Run from the repo root with .whl (and .devcache) carried; about 7.5 minutes.
set -uo pipefail
BUDGET=${BUDGET:-450}
source tools/device/parts.sh || exit 1
F=$M/q4x12-00001-of-00002.gguf
make_q4x12
C="python3 tools/device/prompt_chunks_check.py $F --tokens 32768 --vram-budget 4.4"
part prompt_chunks 180 $C
part prompt_chunks_cprofile 70 $C --only int8 --cprofile int8
part profile32k_4g4_int8 75 python3 tools/device/profile_prompt.py $F --tokens 32768 --vram-budget 4.4 --rows 25 \
  --kv-dtype int8
summarize qsachunks "^==|chunk to|after the last|total|prefill [0-9]+ tokens|GPU kernel time|streaming|lending|Error"
