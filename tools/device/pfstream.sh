#!/usr/bin/env bash
# On the GPU machine (issue 6, pfstream): prompt chunks whose expert work buffers live in borrowed cache slots.
# 1. The work-arena kernel tests compiled on CUDA (every buffer a view into slot bytes, output bytes unchanged).
# 2. check_prefill_stream.py: streamed == all-resident logits bytes with and without borrowing, the borrowed run
#    holding every buffer (no overflow), the cache as before after the prompt.
# 3. The chunk rule at --vram-budget 12 (`strata info --plan`), then `strata bench prompt` on the Qwen3-30B-A3B shape
#    (Q4_0) at --vram-budget 12, --ctx 4096,32768, with --prefill-borrow auto and off: tok/s, chunk sizes, borrowed
#    slots, PCIe floor. Run from the repo root with .whl carried; logs come back as one tarball; about 6 minutes.
set -uo pipefail
BUDGET=${BUDGET:-355}
source tools/device/parts.sh || exit 1
CTX=${CTX:-4096,32768}
# The full-size model is written on the CPU while the GPU checks run.
[ -f $M/a3b.gguf ] || (part make_a3b 170 python3 -m strata make-model --arch qwen3moe --preset qwen3-30b-a3b \
  --quant Q4_0 -o $M/a3b.gguf) &
part arena_tests 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/moe/test_work_arena.py
part check_stream 80 python3 tools/device/check_prefill_stream.py
wait
for kv in float16 int8; do
  part plan_12g_$kv 20 python3 -m strata info $M/a3b.gguf --plan --device cuda --vram-budget 12 --ctx 32768 --kv-dtype $kv
done
for borrow in auto off; do
  part bench_fp16_borrow_$borrow 110 python3 -m strata bench prompt $M/a3b.gguf --device cuda --ctx $CTX \
    --vram-budget 12 --prefill-borrow $borrow
done
# int8 paged KV has no [chunk, context] mask: there borrowing matters most (if time is left).
for borrow in auto off; do
  part bench_int8_borrow_$borrow 60 python3 -m strata bench prompt $M/a3b.gguf --device cuda --ctx 32768 \
    --kv-dtype int8 --vram-budget 12 --prefill-borrow $borrow
done
echo "total ${SECONDS}s" | tee -a $L/times.txt
save_cache
tar czf "$OUT/pfstream_logs.tgz" -C $L .
cat $L/times.txt
for f in $L/*.log; do echo "=== $f"; grep -v "^\s*$" "$f" | grep -v "^-\{20\}" | tail -n 16 | cut -c1-220; done
