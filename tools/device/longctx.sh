#!/usr/bin/env bash
# On the GPU machine (H200), from the repo root; issue 5, long-context decode (session 5, `longctx`). Capped parts:
# the kv-resident tests on CUDA (pinned host pages, the one-copy gathers, compiled kernels), then `strata bench
# long-context` (int8 KV: dense and quest decoding through the captured step, quest step by step, quest with
# --kv-resident 8192) at 16K and 32K prompt tokens on the synthetic `small` qwen3 and qwen3next (Q8_0).
# Under 5 minutes (BUDGET 285 s); carry .whl (and .devcache). Logs come back as one tarball, the tables as
# tables.txt, compiled kernels as cache_triton.txz and cache_numba.txz.
set -uo pipefail
BUDGET=${BUDGET:-285}
source tools/device/parts.sh || exit 1  # inside a session batch: nothing installed again (parts.sh says how)
L=$OUT/longctx_logs; mkdir -p $L  # its own logs, tarred and removed at the end (a call returns at most 8 files)
part tests 45 python3 -m pytest -q -p no:cacheprovider --durations=5 tests/engine/test_kv_resident.py
for arch in qwen3 qwen3next; do
  [ -f $M/small-$arch.gguf ] || python3 -m strata make-model --arch $arch --preset small --quant Q8_0 \
    -o $M/small-$arch.gguf >/dev/null
done
bench() {  # name cap model prompt-tokens
  part "$1" "$2" python3 -m strata bench long-context "$3" --device cuda --prompt-tokens "$4" --gen-tokens 16 \
    --resident 8192
}
bench qwen3_16k 80 $M/small-qwen3.gguf 16384  # the first compiles the kernels (the later ones find them cached)
bench next_16k 60 $M/small-qwen3next.gguf 16384
bench qwen3_32k 50 $M/small-qwen3.gguf 32768
bench next_32k 45 $M/small-qwen3next.gguf 32768
echo "total ${SECONDS}s" | tee -a $L/times.txt
save_cache
for f in qwen3_16k next_16k qwen3_32k next_32k; do echo "== $f"; cat $L/$f.log 2>/dev/null | grep -v "^strata:"; done \
  > "$OUT/tables.txt"
cat $L/times.txt
tail -n 8 $L/tests.log
tar czf "$OUT/logs.tgz" -C $L .
rm -rf $L
cat "$OUT/tables.txt"
