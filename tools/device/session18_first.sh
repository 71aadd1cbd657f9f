#!/usr/bin/env bash
# Ready for session 18's first call (one H200, ~8 minutes: timeout_s 540; carry .whl, .ab and .devcache). Issue 4,
# after session 17 (the routing launch at one warp: 1.77 ms; the int8 cache's native dots: 2.02 ms), the fp16
# default, arms alternating round by round:
#   default   .ab/head (this commit)
#   novh      .ab/novh (qk_norm_rope_store.py before 6356bcb: the value row loaded after the key's store)
#   split     .ab/head under STRATA_DP4A + STRATA_DP4A_SPLIT (its routing launch, with the normed row's int8 codes,
#             now at one warp too)
#   split_of  .ab/of under both switches, o's matvec left in float (no `quantize_x` launch a layer; by session
#             15's increments quantize_x 1.93 + the split o ~2.7 us against the float o's 3.5)
#   turn      .ab/head under STRATA_DECODE_TURN (9d69d24: the q/k norm + RoPE + store inside the attention's launch,
#             one launch a layer fewer; its CUDA tests first)
# then where the default step spends its time (profile_decode.py --increments) and the tiny qwen4exp's captured
# decode (int8 KV, QSA; D 256: the native dots in chunks of 32) against step by step.
# Make the arms first:
#   rm -rf .ab && for a in head novh of tf; do mkdir -p .ab/$a && git archive HEAD strata ':!strata/data' | tar -x -C .ab/$a; done
#   (novh: in .ab/novh's qk_norm_rope_store.py, store_key_value's value loads moved after the key's store, as before
#   6356bcb; that commit's whole file no longer fits: decode_turn.py imports store_key_value from it)
#   sed -i 's/out = dp4a_step.matvec(heads, self.attention\[i\].o) if self.dp4a_wired else None/out = None/' \
#     .ab/of/strata/models/decoder.py
#   sed -i 's/cache_dtype in (torch.float16, torch.int8)/cache_dtype in (torch.float16,)/' \
#     .ab/tf/strata/kernels/attention/decode_short.py   (.ab/tf: session18_second.sh's)
set -uo pipefail
BUDGET=${BUDGET:-420}
source tools/device/parts.sh || exit 1
make_a3b_bg && BUDGET=$((BUDGET + 60))
Q=$(mktemp -d /tmp/s18-q4.XXXX)
part graphs_qwen4exp 60 python3 tools/device/qwen4exp_check.py $Q graphs
part tests 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/attention/test_decode_short.py
part attn 40 python3 -m strata bench decode-attn --spans 256  # the turned launch alone against the two
wait_file $A3B 240
SPLIT="env STRATA_DP4A=1 STRATA_DP4A_SPLIT=1"
for round in 1 2; do
  part default_$round 30 env -C .ab/head $A3B_RESIDENT
  part novh_$round 30 env -C .ab/novh $A3B_RESIDENT
  part split_$round 30 env -C .ab/head $SPLIT $A3B_RESIDENT
  part split_of_$round 30 env -C .ab/of $SPLIT $A3B_RESIDENT
  part turn_$round 30 env -C .ab/head STRATA_DECODE_TURN=1 $A3B_RESIDENT
done
part inc_default 40 python3 tools/device/profile_decode.py $A3B --steps 8 --vram-budget 24 --increments
finish 14
