"""What a conversation checkpoint costs and saves (`strata bench checkpoints MODEL`).

Conversation A (P prompt tokens) is read, checkpointed and left for B (P tokens); A's follow-up (F more tokens) then
restores A's checkpoint and reads only its F tokens. The table gives the checkpoint's bytes, the copy out and back
(GB/s beside the link's pinned-copy ceiling on a GPU; the first save beside the best: it allocates its host memory
afresh, as every save does until the store is full and drops one), the follow-up read three ways (all P+F tokens; F
tokens after the live cache; F tokens after a restore), and checks the restored path: its logits must equal the live
path's bit for bit, and differ from the full read (which attends within its chunk at full precision, not through the
stored KV) by at most 1e-5 of the largest logit with float32 activations and KV, 3e-2 otherwise.

    python -m strata.bench.checkpoints MODEL [--device cuda] [--kv-dtype float16] [--prompt-tokens 4096]
        [--follow-tokens 64] [--reps 3]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from strata.bench.ceilings import sync
from strata.engine.checkpoints import CheckpointStore, snapshot
from strata.engine.engine import Engine, EngineConfig


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="strata bench checkpoints", description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--kv-dtype", default="float16")
    p.add_argument("--prompt-tokens", type=int, default=4096, help="P: tokens of each conversation (default 4096)")
    p.add_argument("--follow-tokens", type=int, default=64, help="F: new tokens of the follow-up (default 64)")
    p.add_argument("--reps", type=int, default=3, help="timed repetitions; the best is reported (default 3)")
    return p


def _timed(device, work):
    sync(device)
    start = time.perf_counter()
    out = work()
    sync(device)
    return time.perf_counter() - start, out


def _fresh(engine: Engine) -> None:
    """No live sequence and no checkpoints: the next prompt is read from its first token."""
    engine.cached_tokens = []
    engine.kv.truncate(0)
    engine.checkpoints = CheckpointStore(4, 1 << 40)


def run(args) -> dict:
    n_ctx = 2 * args.prompt_tokens + args.follow_tokens + 8
    engine = Engine(args.model, EngineConfig(device=args.device, dtype=args.dtype, kv_dtype=args.kv_dtype,
                                             n_ctx=n_ctx))
    device, vocab = engine.device, engine.model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    a, b, more = (torch.randint(0, vocab, (n,), generator=gen).tolist()
                  for n in (args.prompt_tokens, args.prompt_tokens, args.follow_tokens))
    times: dict[str, list[float]] = {}

    def keep(name: str, seconds: float) -> None:
        times.setdefault(name, []).append(seconds)

    for _ in range(args.reps + 1):  # the first run warms up allocations and kernels
        _fresh(engine)
        seconds, full = _timed(device, lambda: engine.prefill(a + more))
        keep("full", seconds)
        _fresh(engine)
        engine.prefill(a)
        seconds, live = _timed(device, lambda: engine.prefill(a + more, checkpoint=False))
        keep("live", seconds)
        _fresh(engine)
        engine.prefill(a)
        seconds, _ = _timed(device, lambda: snapshot(engine.kv, len(a)))  # the copy a save makes
        keep("save", seconds)
        engine.prefill(b)  # leaving A saves it
        store = engine.checkpoints
        checkpoint = store.items[tuple(a)]
        seconds, restored = _timed(device, lambda: engine.prefill(a + more, checkpoint=False))
        keep("restored", seconds)
        assert store.stats.restored == 1, "the follow-up did not restore its checkpoint"
        seconds, _ = _timed(device, lambda: store.restore(checkpoint, engine.kv, len(a)))
        keep("restore", seconds)
    best = {name: min(values[1:]) for name, values in times.items()}
    best["first save"] = times["save"][0]
    full, live, restored = (t.float().cpu() for t in (full, live, restored))
    error = ((restored - full).abs().max() / full.abs().max()).item()
    return {"bytes": checkpoint.n_bytes, "tokens": len(a), "seconds": best, "identical": torch.equal(restored, live),
            "error_vs_full": error, "engine": engine,
            "bound": 1e-5 if engine.dtype == torch.float32 and args.kv_dtype == "float32" else 3e-2}


def report(args, result: dict) -> str:
    engine, s = result["engine"], result["seconds"]
    gb = result["bytes"] / 1e9
    name = torch.cuda.get_device_name(engine.device) if engine.device.type == "cuda" else "CPU"
    p, f = args.prompt_tokens, args.follow_tokens
    lines = [
        f"model       {engine.file.path.name} ({engine.model.config.arch}), {name}, activations {engine.dtype}, "
        f"KV {args.kv_dtype}",
        f"checkpoint  {result['bytes'] / 2**20:.1f} MiB for {result['tokens']} tokens "
        f"({result['bytes'] / result['tokens'] / 1024:.1f} KiB a token)",
        f"save        {s['save'] * 1e3:8.2f} ms  ({gb / s['save']:.1f} GB/s to host); the first "
        f"{s['first save'] * 1e3:.2f} ms (its host memory allocated afresh)",
        f"restore     {s['restore'] * 1e3:8.2f} ms  ({gb / s['restore']:.1f} GB/s back)",
        f"follow-up   all {p + f} tokens {s['full'] * 1e3:9.2f} ms | {f} after the live cache {s['live'] * 1e3:8.2f} ms"
        f" | {f} after a restore {s['restored'] * 1e3:8.2f} ms  ({s['full'] / s['restored']:.1f}x faster than all)",
        f"check       restored == live bit for bit: {'yes' if result['identical'] else 'NO'}; vs the full read "
        f"{result['error_vs_full']:.2e} of the largest logit (bound {result['bound']:.0e})",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    result = run(args)
    print(report(args, result))
    return 0 if result["identical"] and result["error_vs_full"] <= result["bound"] else 1


if __name__ == "__main__":
    sys.exit(main())
