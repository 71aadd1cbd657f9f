"""On the GPU: qwen4exp's n-gram rows gathered ahead on a host thread (models/ngram_prefetch.py) against the in-line
lookup (STRATA_NGRAM_SYNC=1).

1. The tiny model (a random F16 table) on the GPU: 3,000 tokens in chunks of 256 (all prefetched, pinned, copied
   without a host wait): the logits of every position must be the in-line lookup's bytes (PASS / FAIL).
2. MODEL (the 12-layer full-size file), for each of --tokens: a warm prompt, then the median wall time of --reps
   fresh prompts each way, the chunks whose rows came from the thread, and whether the last logits are the same
   bytes; then one 8,192-token chunk's host lookup: the previous gather (distinct rows through torch) against the
   rows decoded into a pinned buffer (models/ngram_rows.py), ms, over a sweep of piece threads and piece sizes.

Usage: python3 tools/device/check_ngram.py [MODEL.gguf] [--tokens 4096,32768] [--kv-dtype int8] [--reps 2]
       [--device cpu] (a dry run of this script)
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import strata  # noqa: E402
from strata import switches  # noqa: E402
from strata.engine.engine import Engine, EngineConfig  # noqa: E402
from strata.models import ngram_rows  # noqa: E402
from strata.models.synthetic import make_model  # noqa: E402

SWEEP = [(1, 16384), (2, 16384), (4, 16384), (8, 16384), (4, 4096), (4, 32768), (8, 8192)]  # (piece threads, table rows a piece)


def _ids(n: int, vocab: int, seed: int) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


DEVICE = torch.device("cuda")


def sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def tiny_parity() -> bool:
    path = make_model(Path(tempfile.mkdtemp()) / "tiny.gguf", arch="qwen4exp", preset="tiny", quant="Q8_0")
    ids = _ids(3000, 512, 0)
    out = {}
    for sync in (True, False):
        llm = strata.LLM(path, device=DEVICE.type, prefill_chunk=256, checkpoints=0)
        with switches.override(STRATA_NGRAM_SYNC=sync):
            out[sync] = llm.logits(ids)
        taken = llm.engine.model.ngram_prefetch.taken
    same = torch.equal(out[True], out[False])
    print(f"tiny, 3000 tokens in chunks of 256: {taken} chunks' rows from the thread; logits of every position "
          f"{'the same bytes' if same else 'DIFFER'} -> {'PASS' if same and taken == 12 else 'FAIL'}")
    return same and taken == 12


def timed(engine: Engine, n: int, seed: int) -> tuple[float, torch.Tensor]:
    sync()
    started = time.perf_counter()
    logits = engine.prefill(_ids(n, engine.model.config.vocab_size, seed))
    sync()
    return time.perf_counter() - started, logits


def full_size(path: str, contexts: list[int], kv_dtype: str, reps: int) -> None:
    engine = Engine(path, EngineConfig(device=DEVICE.type, dtype="bfloat16", n_ctx=max(contexts) + 64, kv_dtype=kv_dtype,
                                       checkpoints=0))
    model = engine.model
    timed(engine, min(contexts), 1)  # compile and warm
    for n in contexts:
        seconds, last = {}, {}
        for sync in (True, False):
            with switches.override(STRATA_NGRAM_SYNC=sync):
                timed(engine, n, 2)  # warm this path at this size
                taken = model.ngram_prefetch.taken
                runs = [timed(engine, n, 10 + rep) for rep in range(reps)]
                seconds[sync] = statistics.median(t for t, _ in runs)
                last[sync] = runs[0][1]
                taken = model.ngram_prefetch.taken - taken
            label = "in line (STRATA_NGRAM_SYNC=1)" if sync else "prefetched"
            print(f"{n:>6} tokens {label:>30}: {seconds[sync] * 1e3:8.1f} ms = {n / seconds[sync]:8.0f} tok/s, "
                  f"{taken / reps:.0f} chunks a prompt from the thread")
        diff = (last[True].float() - last[False].float()).abs().max().item()
        print(f"{n:>6} tokens: {seconds[True] / seconds[False]:.2f}x; last logits "
              f"{'the same bytes' if torch.equal(last[True], last[False]) else f'differ by up to {diff:.3g}'}")
    lookup_sweep(model)


def _host_ms(lookup) -> float:
    lookup()
    times = []
    for _ in range(5):
        started = time.perf_counter()
        lookup()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def lookup_sweep(model) -> None:
    """One 8,192-token chunk's host lookup: the previous gather, then the decode into pinned memory at each
    (threads, rows a piece) of SWEEP, the default marked."""
    table, hash_ = model.ngram_table, model.ngram_hash
    rows = hash_.rows(np.asarray(_ids(8192, model.config.vocab_size, 99), dtype=np.int64), (-1, -1))
    pinned = torch.empty(8192, model.config.n_embd, pin_memory=DEVICE.type == "cuda")
    print(f"one 8192-token chunk's lookup, previous gather (distinct rows, torch): "
          f"{_host_ms(lambda: table._gather_distinct(rows)):.1f} ms (host)")
    default = (ngram_rows.PIECE_THREADS, ngram_rows.PIECE_ROWS)
    for threads, piece in dict.fromkeys([default, *SWEEP]):
        ngram_rows.PIECE_THREADS, ngram_rows.PIECE_ROWS = threads, piece
        ms = _host_ms(lambda: table.gather_into(rows, pinned))
        mark = "  (default)" if (threads, piece) == default else ""
        print(f"one 8192-token chunk's lookup, decoded into pinned memory, {threads} threads x {piece} rows a piece: "
              f"{ms:.1f} ms (host){mark}")
    ngram_rows.PIECE_THREADS, ngram_rows.PIECE_ROWS = default
    print("rows equal:", torch.equal(table._gather_distinct(rows), (table.gather_into(rows, pinned), pinned)[1]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", nargs="?")
    parser.add_argument("--tokens", default="4096,32768")
    parser.add_argument("--kv-dtype", default="int8")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    global DEVICE
    DEVICE = torch.device(args.device)
    ok = tiny_parity()
    if args.model:
        full_size(args.model, [int(t) for t in args.tokens.split(",")], args.kv_dtype, args.reps)
    print("ALL OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
