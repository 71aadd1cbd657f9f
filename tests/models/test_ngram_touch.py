"""A large n-gram gather faults its rows' pages in from many threads first (models/ngram_rows.touch_rows): the pages
of the rows asked for become resident, the others stay out (the kernel's residency read back with mincore)."""

import ctypes
import ctypes.util
import mmap
import os

import numpy as np
import pytest

import strata.models.ngram_rows as ngram_rows
from strata.gguf.access_advice import advise_random

PAGE = mmap.PAGESIZE


def _resident(array: np.ndarray) -> np.ndarray:
    """bool [pages]: which pages of a page-aligned mapped array are in memory (mincore)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    n_pages = -(-array.nbytes // PAGE)
    vec = (ctypes.c_ubyte * n_pages)()
    if libc.mincore(ctypes.c_void_p(array.ctypes.data), ctypes.c_size_t(array.nbytes), vec) != 0:
        pytest.skip(f"mincore failed (errno {ctypes.get_errno()})")
    return np.frombuffer(vec, dtype=np.uint8) & 1 == 1


@pytest.mark.skipif(not hasattr(os, "posix_fadvise") or ctypes.util.find_library("c") is None, reason="Linux")
def test_touching_rows_brings_in_their_pages_only(tmp_path, monkeypatch):
    monkeypatch.setattr(ngram_rows, "TOUCH_MIN_ROWS", 1)
    row_bytes, n_rows = 90, 64 * PAGE // 90  # rows cross page boundaries, as the table's 90-byte rows do
    path = tmp_path / "table.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, row_bytes * n_rows, dtype=np.uint8).tobytes())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # the file's pages out of the page cache
    finally:
        os.close(fd)
    table = np.memmap(path, mode="r", shape=(n_rows, row_bytes))
    advise_random(table)  # as the engine maps the table: no readahead around a fault
    if _resident(table).any():
        pytest.skip("this file system keeps the file's pages in memory (tmpfs): nothing to bring in")
    index = np.array([3, 500, 501, 2000], dtype=np.int64)
    ngram_rows.touch_rows(table, index)
    resident = _resident(table)
    wanted = {b // PAGE for r in index.tolist() for b in (r * row_bytes, r * row_bytes + row_bytes - 1)}
    assert all(resident[p] for p in wanted)
    assert not resident[50:].any() and resident.sum() <= 2 * len(wanted)  # rows not asked for stay out
