"""A large n-gram gather faults its rows' pages in from many threads first (models/ngram_rows.touch_rows): the pages
of the rows asked for become resident, the others stay out (the kernel's residency read back with mincore)."""

import numpy as np

import strata.models.ngram_rows as ngram_rows
from tests.page_cache import PAGE, evicted_table, resident_pages


def test_touching_rows_brings_in_their_pages_only(tmp_path, monkeypatch):
    monkeypatch.setattr(ngram_rows, "TOUCH_MIN_ROWS", 1)
    row_bytes = 90
    table, _ = evicted_table(tmp_path, row_bytes)
    index = np.array([3, 500, 501, 2000], dtype=np.int64)
    ngram_rows.touch_rows(table, index)
    resident = resident_pages(table)
    wanted = {b // PAGE for r in index.tolist() for b in (r * row_bytes, r * row_bytes + row_bytes - 1)}
    assert all(resident[p] for p in wanted)
    assert not resident[50:].any() and resident.sum() <= 2 * len(wanted)  # rows not asked for stay out
