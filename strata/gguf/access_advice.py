"""Tell the kernel how a memory-mapped tensor is read: at random (madvise MADV_RANDOM over its pages), and which rows
are wanted next (posix_fadvise WILLNEED, `ReadAhead`).

Why: qwen4exp's n-gram table (28.8 GB, its own shard) is read 16 rows of ~90 bytes a token, each on another page.
By default every page fault on a file mapping also reads the pages around it (readahead, 128 KB): 32 pages read for
one row, and on a cold page cache the forward waits for the chunk's lookup. With the advice a fault reads its own
page only; warm rows are unaffected (tools/ngram_cold.py: the engine's gather from a cold full-size table, a 28.8 GB
hole, on session 11's 2-core development VM: 12.5 ms a row without the advice, 5.6 us with it).

A decode step needs its 16 rows before it can start; from a cold drive those are 16 page faults one after another.
`ReadAhead.will_need` asks the kernel for all of them first (a non-blocking system call a row), so their reads run
at once and the faults that follow find them landed or landing (the same VM, 16 random rows of a cold 4 GB file:
1.4-1.8 ms a step faulted one by one, 0.38-0.41 ms asked for first; warm, the same 72-78 us).
"""

from __future__ import annotations

import mmap
import os
import weakref

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


def _placement(view: np.ndarray) -> tuple[object, int, int] | None:
    """(the mapping, view's first byte in it, that byte's offset in the file), or None where view is not one
    contiguous piece of a file mapping."""
    mapped = _mapping_of(view)
    if mapped is None or view.nbytes == 0 or not view.flags.c_contiguous:
        return None
    first = view.ctypes.data - np.frombuffer(mapped, dtype=np.uint8, count=1).ctypes.data  # from its first byte
    if not 0 <= first <= len(mapped) - view.nbytes:
        return None
    offset = int(getattr(view, "offset", 0))  # np.memmap: where its array starts in the file; its mapping starts
    return mapped, first, first + offset - offset % mmap.ALLOCATIONGRANULARITY  # there rounded down to a granule


def advise_random(view: np.ndarray) -> bool:
    """MADV_RANDOM over the pages `view` spans in its file mapping; False where there is none (an array in memory)
    or the platform has no madvise. The advice changes only how faults read ahead, never the bytes."""
    found = _placement(view)
    if found is None or not hasattr(found[0], "madvise") or not hasattr(mmap, "MADV_RANDOM"):
        return False
    mapped, first, _ = found
    start = first - first % PAGE
    mapped.madvise(mmap.MADV_RANDOM, start, first + view.nbytes - start)
    return True


class ReadAhead:
    """Rows of a memory-mapped 2-D tensor (uint8 [rows, row_bytes]) asked of the kernel ahead of their use."""

    def __init__(self, path: str, offset: int, row_bytes: int):
        self.offset, self.row_bytes = offset, row_bytes
        self.fd = os.open(path, os.O_RDONLY)
        weakref.finalize(self, os.close, self.fd)

    @classmethod
    def of(cls, view: np.ndarray, path: str) -> "ReadAhead | None":
        """For the rows of `view`, mapped from the file at `path`; None where the platform cannot advise a file or
        the view is not mapped from one."""
        found = _placement(view)
        if found is None or view.ndim != 2 or not hasattr(os, "posix_fadvise"):
            return None
        return cls(path, found[2], view.shape[1])

    def will_need(self, rows) -> None:
        """Start reading these rows' pages now, without waiting for them."""
        for row in rows:
            os.posix_fadvise(self.fd, self.offset + int(row) * self.row_bytes, self.row_bytes, os.POSIX_FADV_WILLNEED)
