#!/usr/bin/env bash
# On the GPU machine (issue 6, ngram): qwen4exp's n-gram rows gathered ahead on a host thread into pinned memory
# (models/ngram_prefetch.py) instead of in line at layer 1 of every chunk (STRATA_NGRAM_SYNC=1, the previous form).
# 1. The 12-layer full-size file (as pfstream2.sh; skipped if present).
# 2. check_ngram.py: the tiny model's logits bytes equal through the thread and pinned copies (PASS/FAIL); on the
#    12-layer file at 4,096 and 32,768 tokens (int8 KV, all resident), wall ms both ways (one process, so one
#    load), chunks served by the thread, last logits bytes; one 8,192-token chunk's host lookup old vs new.
# 3. profile_prompt.py at 32,768 and 4,096 tokens (int8): GPU kernel time vs wall (was 986 / 1,697 ms and
#    150 / 317 ms), the host's ops (aten::index_select, cudaStreamSynchronize, Memcpy HtoD Pageable should be gone
#    or small), and --syncs: every remaining host wait of a prompt by call site.
# 4. `strata bench prompt --ctx 4096,32768 --kv-dtype int8`, the default path (the in-line times are in step 2).
# Run from the repo root with .whl (and .devcache) carried; logs come back as one tarball; about 4 minutes with the
# model present (+80 s to make it).
set -uo pipefail
BUDGET=${BUDGET:-330}
source tools/device/parts.sh || exit 1
F=$M/q4x12-00001-of-00002.gguf
make_q4x12
part check_ngram 90 python3 tools/device/check_ngram.py $F --tokens 4096,32768 --kv-dtype int8 --reps 2
P="python3 tools/device/profile_prompt.py $F --rows 25 --kv-dtype int8"
part profile_32k 75 $P --tokens 32768 --syncs
part profile_4k 45 $P --tokens 4096 --syncs
part bench_prompt 60 python3 -m strata bench prompt $F --device cuda --ctx 4096,32768 --kv-dtype int8
[ -n "${NESTED:-}" ] && exit 0
finish 40
