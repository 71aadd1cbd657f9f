"""madvise(MADV_RANDOM) over a memory-mapped tensor (strata/gguf/access_advice.py): the kernel's flag on the mapping's
pages, read back from /proc/self/smaps ("rr": random read), and the bytes unchanged."""

import mmap
from pathlib import Path

import numpy as np
import pytest

from strata.gguf.access_advice import advise_random

SMAPS = Path("/proc/self/smaps")


def _flags_at(address: int) -> set[str]:
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


@pytest.mark.skipif(not SMAPS.exists() or not hasattr(mmap, "MADV_RANDOM"), reason="Linux's smaps and madvise")
def test_a_mapped_view_gets_random_read_advice_on_its_pages_only(tmp_path):
    path = tmp_path / "table.bin"
    path.write_bytes(bytes(range(256)) * (64 * mmap.PAGESIZE // 256))
    mapped = np.memmap(path, mode="r")
    view = mapped[3 * mmap.PAGESIZE + 100 : 9 * mmap.PAGESIZE].reshape(-1, 4)  # a tensor not page aligned
    before = view.copy()
    assert "rr" not in _flags_at(view.ctypes.data)
    assert advise_random(view)
    assert "rr" in _flags_at(view.ctypes.data) and "rr" in _flags_at(view.ctypes.data + view.nbytes - 1)
    assert "rr" not in _flags_at(mapped.ctypes.data + 20 * mmap.PAGESIZE)  # past the view: as it was
    assert np.array_equal(view, before)


def test_arrays_not_mapped_from_a_file_are_left_alone():
    assert not advise_random(np.zeros(4096, dtype=np.uint8))
    assert not advise_random(np.zeros(0, dtype=np.uint8))
