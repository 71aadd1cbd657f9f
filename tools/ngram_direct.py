"""Cold n-gram rows from a drive: page faults through the memory mapping (the engine's way) against direct reads.

The engine gathers a prompt chunk's n-gram rows (16 a token, 90-byte IQ4_NL rows of a 28.8 GB table) through a
memory mapping advised MADV_RANDOM, its pages faulted in from TOUCH_THREADS threads first (models/ngram_rows.py).
Strata reads the same table with O_DIRECT, 4 KiB at a time, 256 reads in flight. This times, on a file of real
bytes whose pages are dropped from the page cache before each run, the pages under N random rows:
  mmap    `ngram_rows.touch_rows` from T threads (what the engine does before decoding);
  direct  each page read by `os.preadv` with O_DIRECT into page-aligned buffers, from T threads (the reads release
          the GIL, so T reads are in flight).
Only the drive's side: the decode after it is the same either way. Usage:
python3 tools/ngram_direct.py [--file /tmp/ngram_real.bin] [--gib 4] [--rows 65536] [--threads 32,64,128]
"""

import argparse
import mmap
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import strata.models.ngram_rows as ngram_rows  # noqa: E402
from strata.gguf.access_advice import advise_random  # noqa: E402

from ngram_cold import drop_pages  # noqa: E402  (this folder)

ROW_BYTES, PAGE = 90, 4096


def make_file(path: Path, gib: float) -> None:
    size = int(gib * (1 << 30)) // PAGE * PAGE
    if path.exists() and path.stat().st_size == size:
        return
    rng = np.random.default_rng(0)
    with open(path, "wb") as f:
        for _ in range(size // (64 << 20)):
            f.write(rng.integers(0, 256, 64 << 20, dtype=np.uint8).tobytes())
        f.write(rng.integers(0, 256, size % (64 << 20), dtype=np.uint8).tobytes())
        f.flush()
        os.fsync(f.fileno())


def pages_of(index: np.ndarray) -> np.ndarray:
    first = index * ROW_BYTES // PAGE
    last = (index * ROW_BYTES + ROW_BYTES - 1) // PAGE
    return np.unique(np.concatenate([first, last]))


def by_mmap(path: Path, index: np.ndarray, threads: int) -> float:
    table = np.memmap(path, mode="r", shape=(path.stat().st_size // ROW_BYTES, ROW_BYTES))
    advise_random(table)
    ngram_rows.TOUCH_THREADS, ngram_rows.TOUCH_MIN_ROWS = threads, 1
    started = time.perf_counter()
    ngram_rows.touch_rows(table, index)
    return time.perf_counter() - started


def by_direct(path: Path, index: np.ndarray, threads: int) -> float:
    pages = pages_of(index)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buffers = [mmap.mmap(-1, PAGE) for _ in range(threads)]  # page-aligned, as O_DIRECT needs

    def read(part: int) -> int:
        view = memoryview(buffers[part])
        got = 0
        for page in pages[part::threads]:
            got += os.preadv(fd, [view], int(page) * PAGE)
        return got

    try:
        started = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            total = sum(pool.map(read, range(threads)))
        seconds = time.perf_counter() - started
    finally:
        os.close(fd)
    assert total == len(pages) * PAGE
    return seconds


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--file", default="/tmp/ngram_real.bin")
    p.add_argument("--gib", type=float, default=4.0)
    p.add_argument("--rows", type=int, default=65536, help="a 4K prompt's rows: 4,096 tokens x 16")
    p.add_argument("--threads", default="32,64,128")
    p.add_argument("--reps", type=int, default=2)
    args = p.parse_args()
    path = Path(args.file)
    make_file(path, args.gib)
    n_rows = path.stat().st_size // ROW_BYTES
    print(f"{path} ({path.stat().st_size / 2**30:.1f} GiB), {args.rows} random rows a run, pages dropped first")
    for threads in (int(t) for t in args.threads.split(",")):
        for rep in range(args.reps):
            index = np.random.default_rng(1000 * threads + rep).integers(0, n_rows, args.rows).astype(np.int64)
            n_pages = len(pages_of(index))
            cells = []
            for name, way in (("mmap", by_mmap), ("direct", by_direct)):
                drop_pages(path)
                seconds = way(path, index, threads)
                cells.append(f"{name} {seconds * 1e3:8.1f} ms ({seconds * 1e6 / n_pages:5.1f} us a page)")
            print(f"  {threads:3d} threads, {n_pages} pages: " + "; ".join(cells))


if __name__ == "__main__":
    main()
