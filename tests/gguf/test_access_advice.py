"""How a memory-mapped tensor is read (strata/gguf/access_advice.py): madvise(MADV_RANDOM), the kernel's flag on the
mapping's pages read back from /proc/self/smaps ("rr": random read) with the bytes unchanged; ReadAhead's
posix_fadvise(WILLNEED) at the rows' places in the file, and the pages it brings in."""

import mmap
import os
import time

import numpy as np
import pytest

from strata.gguf.access_advice import ReadAhead, advise_random
from tests.page_cache import SMAPS, evicted_table, mapping_flags, resident_pages


@pytest.mark.skipif(not SMAPS.exists() or not hasattr(mmap, "MADV_RANDOM"), reason="Linux's smaps and madvise")
def test_a_mapped_view_gets_random_read_advice_on_its_pages_only(tmp_path):
    path = tmp_path / "table.bin"
    path.write_bytes(bytes(range(256)) * (64 * mmap.PAGESIZE // 256))
    mapped = np.memmap(path, mode="r")
    view = mapped[3 * mmap.PAGESIZE + 100 : 9 * mmap.PAGESIZE].reshape(-1, 4)  # a tensor not page aligned
    before = view.copy()
    assert "rr" not in mapping_flags(view.ctypes.data)
    assert advise_random(view)
    assert "rr" in mapping_flags(view.ctypes.data) and "rr" in mapping_flags(view.ctypes.data + view.nbytes - 1)
    assert "rr" not in mapping_flags(mapped.ctypes.data + 20 * mmap.PAGESIZE)  # past the view: as it was
    assert np.array_equal(view, before)


def test_arrays_not_mapped_from_a_file_are_left_alone():
    assert not advise_random(np.zeros(4096, dtype=np.uint8))
    assert not advise_random(np.zeros(0, dtype=np.uint8))


@pytest.mark.parametrize("map_offset", [0, 5000])
def test_read_ahead_asks_for_the_file_bytes_of_the_rows(tmp_path, monkeypatch, map_offset):
    """ReadAhead's offsets are the rows' places in the file, for a view past a header in a mapping that starts at
    the file's first byte (as gguf maps) or inside it (np.memmap's offset, its mapping rounded down to a granule)."""
    header, row_bytes, n_rows = 333, 90, 40
    path = tmp_path / "rows.bin"
    path.write_bytes(np.random.default_rng(1).integers(0, 256, map_offset + header + row_bytes * n_rows,
                                                       dtype=np.uint8).tobytes())
    mapped = np.memmap(path, mode="r", offset=map_offset)
    view = mapped[header : header + row_bytes * n_rows].reshape(n_rows, row_bytes)
    asked = []
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, offset, length, advice: asked.append((offset, length, advice)))
    ahead = ReadAhead.of(view, str(path))
    ahead.will_need([2, 37])
    data = path.read_bytes()
    assert [a for _, _, a in asked] == [os.POSIX_FADV_WILLNEED] * 2 and all(n == row_bytes for _, n, _ in asked)
    for (offset, length, _), row in zip(asked, (2, 37)):
        assert data[offset : offset + length] == view[row].tobytes()
    assert ReadAhead.of(np.zeros((4, 8), dtype=np.uint8), str(path)) is None  # not mapped from a file


@pytest.mark.skipif(not SMAPS.exists() or not hasattr(os, "posix_fadvise"), reason="Linux")
def test_rows_asked_for_are_read_in_without_being_touched(tmp_path):
    """will_need starts the reads itself: the rows' pages become resident with no access to the mapping."""
    table, path = evicted_table(tmp_path)
    ahead = ReadAhead.of(table, str(path))
    ahead.will_need([3, 2000])
    pages = {b // mmap.PAGESIZE for r in (3, 2000) for b in (r * 90, r * 90 + 89)}
    deadline = time.monotonic() + 5
    while not all(resident_pages(table)[p] for p in pages) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(resident_pages(table)[p] for p in pages)
