"""Tell the kernel that a memory-mapped tensor is read at random (madvise MADV_RANDOM over its pages).

Why: qwen4exp's n-gram table (28.8 GB, its own shard) is read 16 rows of ~90 bytes a token, each on another page.
By default every page fault on a file mapping also reads the pages around it (readahead, 128 KB): 32 pages read for
one row, and on a cold page cache the forward waits for the chunk's lookup. With the advice a fault reads its own
page only; warm rows are unaffected. tools/ngram_cold.py times the engine's gather from a cold full-size table
(a 28.8 GB hole; on session 11's 2-core development host: 12.5 ms a row without the advice, 5.6 us with it).
"""

from __future__ import annotations

import mmap

import numpy as np

PAGE = mmap.PAGESIZE


def _mapping_of(view: np.ndarray):
    """The mmap object under a numpy view (np.memmap keeps it as `_mmap`, views inherit it), or None."""
    array = view
    while array is not None:
        mapped = getattr(array, "_mmap", None)
        if mapped is not None:
            return mapped
        array = array.base if isinstance(array, np.ndarray) else None
    return None


def advise_random(view: np.ndarray) -> bool:
    """MADV_RANDOM over the pages `view` spans in its file mapping; False where there is none (an array in memory)
    or the platform has no madvise. The advice changes only how faults read ahead, never the bytes."""
    mapped = _mapping_of(view)
    if (mapped is None or not hasattr(mapped, "madvise") or not hasattr(mmap, "MADV_RANDOM") or view.nbytes == 0
            or not view.flags.c_contiguous):
        return False
    base = np.frombuffer(mapped, dtype=np.uint8, count=1).ctypes.data  # the mapping's first byte
    first = view.ctypes.data - base
    if not 0 <= first <= len(mapped) - view.nbytes:
        return False
    start = first - first % PAGE
    mapped.madvise(mmap.MADV_RANDOM, start, first + view.nbytes - start)
    return True
