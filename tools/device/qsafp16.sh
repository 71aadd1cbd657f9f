#!/usr/bin/env bash
# On the GPU machine (issue 6, qsafp16): QSA's selected attention over the fp16 KV cache through the selected-cells
# kernel (kernels/attention/prompt_dense.py) instead of SDPA with a dense [tokens, keys] mask.
# 1. The kernel's tests compiled (float64 bound, vs the dense-mask SDPA, KVCache.attend's choice, a tiny qwen4exp's
#    chunked prompt within 1e-3 of the old path on the GPU).
# 2. `strata bench qsa-attn --sweep`: at 4,096 and 32,768 cells with 2,419-token chunks (24/2 heads x 256), the old
#    path vs the kernel through KVCache.attend, each x its floor; the sweep's configs beside the default.
# 3. qsafp16_check.py on 12 full-size qwen4exp layers, 8,192 tokens at 12 GiB: next-token logits kernel vs
#    STRATA_QSA_DENSE_MASK=1 (same top token, within 3e-2), tok/s of each.
# 4. profile_prompt.py at 32,768 and 4,096 tokens, all resident, fp16 cache, new then old (STRATA_QSA_DENSE_MASK=1).
# Run from the repo root with .whl (and .devcache) carried; logs come back as one tarball; about 5.5 minutes (short of time, the 4K profiles are dropped first).
set -uo pipefail
BUDGET=${BUDGET:-330}
source tools/device/parts.sh || exit 1
F=$M/q4x12-00001-of-00002.gguf
make_q4x12 &
part qsafp16_tests 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/attention/test_prompt_dense.py \
  tests/kernels/attention/test_bench_qsa_attn.py tests/engine/test_qsa_selected_kernel.py
part qsa_attn_sweep 100 python3 -m strata bench qsa-attn --sweep
wait
part check_logits 50 python3 tools/device/qsafp16_check.py $F --tokens 8192 --vram-budget 12
P="python3 tools/device/profile_prompt.py $F --rows 20"  # all resident, as the first call's profile32k_fp16.log (3,241 ms)
part profile_32k_new 45 $P --tokens 32768
STRATA_QSA_DENSE_MASK=1 part profile_32k_old 50 $P --tokens 32768
part profile_4k_new 35 $P --tokens 4096
STRATA_QSA_DENSE_MASK=1 part profile_4k_old 35 $P --tokens 4096
summarize qsafp16 "prefill [0-9]+ tokens|GPU kernel time|tok/s|PASS|FAIL|passed|failed|floor|as fast|selected|Error|_dense_selected|scaled_dot|attention"
