"""The n-gram table's rows gathered from a cold page cache, with and without MADV_RANDOM (gguf/access_advice.py).

Writes the full-size qwen4exp table shard (160 x 320,001,536 IQ4_NL, 28.8 GB, a hole: no disk space) into a fresh
file for each run, so its pages are not in the page cache, maps it as the engine does, and times the engine's own
gather (NgramTable.gather_into) of one prompt chunk's rows (16 a token, hashed from random tokens), then the same
rows again (warm). Usage: python3 tools/ngram_cold.py [--tokens 5731] [--plain-tokens 128] [--dir /tmp]
[--data FILE]

--data FILE: a file of real bytes instead (a hole costs no drive read): its bytes read as IQ4_NL rows of 90 bytes,
its pages dropped from the page cache before each run (posix_fadvise), the rows gathered by the engine's decode
(ngram_rows.decode_rows) with the pages touched first from 1 thread (no touch) and from TOUCH_THREADS; then decode
steps (16 rows each, NgramTable.gather's small path) with and without ReadAhead asking for the rows first.
"""

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import strata.models.ngram_rows as ngram_rows  # noqa: E402
from strata.gguf.access_advice import ReadAhead, advise_random  # noqa: E402
from strata.gguf.reader import GGUFModelFile  # noqa: E402
from strata.gguf.writer import write_gguf  # noqa: E402
from strata.models.ngram_embedding import NgramHash, NgramTable  # noqa: E402
from strata.models.synthetic_qwen4exp import PRESETS, table_tensor  # noqa: E402
from strata.models.weights import QuantWeight  # noqa: E402


def gather_ms(folder: Path, tokens: np.ndarray, advised: bool) -> tuple[float, float]:
    shape = PRESETS["full"]
    path = folder / f"table-{'random' if advised else 'plain'}-{len(tokens)}.gguf"
    write_gguf(path, "qwen4exp", {}, [table_tensor(shape, seed=0)])
    try:
        info = next(iter(GGUFModelFile(path).tensors.values()))
        if advised:
            assert advise_random(info.data)
        table = NgramTable(QuantWeight.from_info(info, "cpu"))
        hashed = NgramHash(vocab_sizes=tuple(shape.head_vocab_sizes)).rows(tokens, (-1, -1))
        out = torch.empty(hashed.shape[0], hashed.shape[1] * table.head_dim)
        times = []
        for _ in range(2):
            started = time.perf_counter()
            table.gather_into(hashed, out)
            times.append((time.perf_counter() - started) * 1e3)
        return times[0], times[1]
    finally:
        path.unlink()


def drop_pages(path: Path) -> None:
    """The file's pages out of the page cache: the next reads come from the drive."""
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


def real_bytes(path: Path, n_rows: int, touch_threads: int, seed: int) -> tuple[float, float]:
    """(cold, warm) ms of decode_rows over n_rows random 90-byte rows of `path` (IQ4_NL blocks of 5 a row)."""
    drop_pages(path)
    row_bytes = 90
    table = np.memmap(path, mode="r", shape=(path.stat().st_size // row_bytes, row_bytes))
    advise_random(table)
    index = np.random.default_rng(seed).integers(0, table.shape[0], n_rows).astype(np.int64)
    out = np.empty((n_rows, 160), dtype=np.float32)
    ngram_rows.TOUCH_THREADS = touch_threads
    times = []
    for _ in range(2):
        started = time.perf_counter()
        ngram_rows.decode_rows(table, ngram_rows.IQ4_NL.ggml_type, index, out)
        times.append((time.perf_counter() - started) * 1e3)
    return times[0], times[1]


def decode_steps(path: Path, steps: int, ahead: bool, seed: int) -> tuple[float, float]:
    """(median, mean) us of a decode step's gather of 16 random cold rows of `path` (IQ4_NL, 160 values a row)."""
    from strata.quant import get_format

    drop_pages(path)
    view = np.memmap(path, mode="r", shape=(path.stat().st_size // 90, 90))
    advise_random(view)
    weight = QuantWeight("table", get_format("IQ4_NL").ggml_type, (view.shape[0], 160), torch.from_numpy(view))
    table = NgramTable(weight, read_ahead=ReadAhead.of(view, str(path)) if ahead else None)
    rng, times = np.random.default_rng(seed), []
    for _ in range(steps):
        rows = rng.integers(0, view.shape[0], (1, 16)).astype(np.uint64)
        started = time.perf_counter()
        table.gather(rows)
        times.append((time.perf_counter() - started) * 1e6)
    return float(np.median(times)), float(np.mean(times))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=5731, help="a chunk's tokens, advised (the engine's way)")
    p.add_argument("--plain-tokens", type=int, default=128, help="tokens without the advice (slow when cold)")
    p.add_argument("--dir", default=tempfile.gettempdir())
    p.add_argument("--data", default="", help="a file of real bytes: cold reads from the drive, touched or not")
    args = p.parse_args()
    if args.data:
        touches = (1, ngram_rows.TOUCH_THREADS)
        for rep, threads in enumerate(touches * 2):
            cold, warm = real_bytes(Path(args.data), 16 * args.tokens, threads, seed=rep)
            print(f"{16 * args.tokens} rows of {args.data}, pages touched from {threads:2d} thread(s) first, "
                  f"{ngram_rows.PIECE_THREADS} decoding: cold {cold:8.1f} ms ({cold * 1e3 / (16 * args.tokens):6.2f} "
                  f"us a row), warm {warm:6.1f} ms")
        for rep, ahead in enumerate((False, True, False, True)):
            median, mean = decode_steps(Path(args.data), 200, ahead, seed=100 + rep)
            print(f"decode steps of 16 cold rows, {'asked for first' if ahead else 'faulted in turn'}: median "
                  f"{median:6.0f} us, mean {mean:6.0f} us")
        return
    rng = np.random.default_rng(0)
    for n, advised in ((args.plain_tokens, False), (args.tokens, True)):
        tokens = rng.integers(0, 248320, n)
        cold, warm = gather_ms(Path(args.dir), tokens, advised)
        print(f"{'MADV_RANDOM' if advised else 'no advice  '} {n:6d} tokens ({16 * n:7d} rows): cold {cold:9.1f} ms "
              f"({cold * 1e3 / (16 * n):7.2f} us a row), warm {warm:7.1f} ms")


if __name__ == "__main__":
    main()
