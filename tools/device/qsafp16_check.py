"""On the GPU: a prompt over the fp16 KV cache on MODEL (the 12-layer full-size qwen4exp), its QSA layers selecting
past 2,051 cells, with the selected-cells kernel (the default) and with the dense-mask SDPA
(STRATA_QSA_DENSE_MASK=1): next-token logits relative difference, the same top token, and each path's wall time.

Usage: python3 tools/device/qsafp16_check.py MODEL.gguf [--tokens N] [--vram-budget GIB]
Bound: 3e-2 of the largest logit (bf16 activations: the old path also rounds the cached past keys to bf16, as
check_prefill_stream.py's chunked-vs-one-pass bound); the relative difference is printed for the record.
"""

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from strata import switches  # noqa: E402
from strata.engine.engine import Engine, EngineConfig  # noqa: E402
from strata.engine.kv import KVCache  # noqa: E402

BOUND = 3e-2


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--vram-budget", type=float, default=12)
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run of this script (the kernel interpreted)")
    args = parser.parse_args()
    if args.device == "cpu":
        KVCache.kernels = True
    engine = Engine(args.model, EngineConfig(device=args.device, dtype="bfloat16", n_ctx=args.tokens + 64,
                                             vram_budget=args.vram_budget if args.device == "cuda" else None,
                                             kv_dtype="float16", checkpoints=0))
    vocab = engine.model.config.vocab_size
    ids = torch.randint(0, vocab, (args.tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    # another prompt past 2,051 cells (its QSA layers select): compiles every kernel outside the timing
    warm = torch.randint(0, vocab, (min(3000, args.tokens),), generator=torch.Generator().manual_seed(1)).tolist()
    calls = []
    original = KVCache.selected_kernel
    KVCache.selected_kernel = lambda self, q: calls.append(original(self, q)) or calls[-1]
    out = {}
    for name, dense_mask in (("kernel", False), ("dense-mask", True)):
        with switches.override(STRATA_QSA_DENSE_MASK=dense_mask):
            calls.clear()
            engine.prefill(warm)  # compile outside the timing; another prompt, so `ids` starts from 0
            sync()
            calls.clear()
            started = time.perf_counter()
            logits = engine.prefill(ids)[-1].float().cpu()
            wall = time.perf_counter() - started
        out[name] = logits
        print(f"{name}: {args.tokens} tokens in {wall * 1e3:.1f} ms ({args.tokens / wall:.1f} tok/s); "
              f"{len(calls)} selected attention calls, {sum(calls)} through the kernel; chunk {engine.prefill_chunk}")
    a, b = out["kernel"], out["dense-mask"]
    rel = ((a - b).abs().max() / b.abs().max()).item()
    same_top = int(a.argmax()) == int(b.argmax())
    ok = rel <= BOUND and same_top
    print(f"{'PASS' if ok else 'FAIL'} next-token logits: max |kernel - dense-mask| {rel:.2e} of the largest "
          f"(bound {BOUND:.0e}); top token {'the same' if same_top else 'differs'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
