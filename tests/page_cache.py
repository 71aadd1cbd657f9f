"""Test helpers that read the kernel's view of a file mapping: its flags (/proc/self/smaps), which of its pages are in
memory (mincore), and a small table file mapped as the engine maps the n-gram table with none of its pages in memory."""

import ctypes
import ctypes.util
import mmap
import os
from pathlib import Path

import numpy as np
import pytest

from strata.gguf.access_advice import advise_random

PAGE = mmap.PAGESIZE
SMAPS = Path("/proc/self/smaps")


def mapping_flags(address: int) -> set[str]:
    """The VmFlags of the mapping region holding `address`."""
    inside = False
    for line in SMAPS.read_text().splitlines():
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and line.startswith("VmFlags:"):
            return set(line.split()[1:])
    return set()


def resident_pages(array: np.ndarray) -> np.ndarray:
    """bool [pages]: which pages of a page-aligned mapped array are in memory (mincore)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    n_pages = -(-array.nbytes // PAGE)
    vec = (ctypes.c_ubyte * n_pages)()
    if libc.mincore(ctypes.c_void_p(array.ctypes.data), ctypes.c_size_t(array.nbytes), vec) != 0:
        pytest.skip(f"mincore failed (errno {ctypes.get_errno()})")
    return np.frombuffer(vec, dtype=np.uint8) & 1 == 1


def evicted_table(folder, row_bytes: int = 90):
    """(a table of 90-byte rows over 64 pages, mapped as the engine maps it, none of its pages in memory; its path).
    Rows cross page boundaries, as the n-gram table's do. Skips where the file system keeps its pages (tmpfs)."""
    if not hasattr(os, "posix_fadvise") or ctypes.util.find_library("c") is None:
        pytest.skip("Linux's posix_fadvise and mincore")
    n_rows = 64 * PAGE // row_bytes
    path = folder / "table.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, row_bytes * n_rows, dtype=np.uint8).tobytes())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # the file's pages out of the page cache
    finally:
        os.close(fd)
    table = np.memmap(path, mode="r", shape=(n_rows, row_bytes))
    advise_random(table)  # as the engine maps the table: no readahead around a fault
    if resident_pages(table).any():
        pytest.skip("this file system keeps the file's pages in memory (tmpfs): nothing to bring in")
    return table, path
