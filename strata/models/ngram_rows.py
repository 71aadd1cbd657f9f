"""Rows of the n-gram table decoded straight into a caller's float32 buffer: a prompt chunk's 16 rows a token.

The values are strata.quant.dequantize's to the bit (a float32 scale times a float32 level is one rounding either
way; float formats convert exactly), without its intermediates: the previous gather deduplicated the rows
(np.unique), dequantized them through torch (two shifts, a mask and a 16-level index_select over every value, each
a full-size temporary) and indexed the result again. Here the rows' bytes are taken from the (memory-mapped) table
piece by piece and decoded into the output:

- IQ4_NL (the full-size table's format): a compiled loop (numba, no GIL) reads each row in place from the table
  and writes its blocks' values in ggml's order (the low nibbles are values 0..15, the high ones 16..31), the fp16
  scale made float32 through a 65,536-entry table, the same bits as the previous numpy pair lookup without a copy
  of the rows first (session 12, one thread of the development VM: a 4K chunk's 65,536 rows of the full-size
  table's mapping, warm, 65 -> 30 ms by tools/ngram_cold.py; from a table in memory 61 -> 16.5 ms; a decode step's
  16 new rows through NgramTable.gather 76 -> 54 us);
- F32 / F16 / BF16: converted in numpy;
- any other format: strata.quant's dequantize of the piece's rows, copied in.

Pieces of PIECE_ROWS rows spread over a few threads (the compiled loop, numpy's take and ufuncs run without the GIL).

A large gather first faults in its rows' pages from TOUCH_THREADS threads (`touch_rows`): on a cold table each fault
is a read from the drive, and a few decoding threads keep only a few in flight (Strata reads this table 256 reads at
a time). On session 11's development VM a chunk's 91,696 cold rows of an 8 GB file took 5.6-6.1 s untouched and
1.45-1.51 s touched from 32 threads (warm: 87 against 91 ms; tools/ngram_cold.py --data).
"""

from __future__ import annotations

import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from numba import njit

from strata.quant import dequantize, get_format
from strata.quant.tables import iq4_nl_levels

# Table rows a piece (~14 MB of temporaries in the formats numpy decodes): an 8,192-token chunk's 131,072 rows make
# 8 pieces, 2 a thread, and few Python steps (each takes the GIL from the thread launching the GPU's work).
# check_ngram.py sweeps both.
PIECE_ROWS = 16384
PIECE_THREADS = max(1, min(4, (os.cpu_count() or 1) // 2))  # leave cores to the thread launching the GPU's work
TOUCH_THREADS = 32  # page faults in flight on a cold table: threads that wait on the drive, not on a core
TOUCH_MIN_ROWS = 4096  # below this the threads' dispatch costs more than the overlap can give

IQ4_NL = get_format("IQ4_NL")
IQ4_NL_BLOCK_BYTES = IQ4_NL.type_size  # a plain int: numba freezes a module global into the compiled loop
FLOATS = {get_format("F32").ggml_type: np.float32, get_format("F16").ggml_type: np.float16,
          get_format("BF16").ggml_type: None}

_pools: dict[str, ThreadPoolExecutor] = {}  # "piece" (decoding), "touch" (faulting pages in)
_pool_lock = threading.Lock()


def _pool(kind: str, threads: int) -> ThreadPoolExecutor:
    with _pool_lock:
        pool = _pools.get(kind)
        if pool is None or pool._max_workers != threads:  # made again when a sweep changes the count
            pool = _pools[kind] = ThreadPoolExecutor(threads, thread_name_prefix=f"strata-ngram-{kind}")
        return pool


def _touch(table: np.ndarray, index: np.ndarray) -> int:
    # A row's first and last byte: its pages, also where it crosses into the next one (the sum makes the reads).
    return int(table[index, 0].sum()) + int(table[index, -1].sum())


def touch_rows(table: np.ndarray, index: np.ndarray) -> None:
    """Fault in the pages of rows `index` of `table` (uint8 [rows, row_bytes], memory-mapped) from TOUCH_THREADS
    threads at once, so that a cold table's reads overlap; the bytes are not changed or kept."""
    if index.shape[0] < TOUCH_MIN_ROWS or TOUCH_THREADS <= 1:
        return
    list(_pool("touch", TOUCH_THREADS).map(lambda part: _touch(table, part), np.array_split(index, TOUCH_THREADS)))


@functools.cache
def _iq4_nl_tables() -> tuple[np.ndarray, np.ndarray]:
    """(IQ4_NL's 16 levels as float32, the float32 value of every fp16 bit pattern): exact conversions."""
    return iq4_nl_levels().astype(np.float32), np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)


@njit(nogil=True, cache=True)
def _iq4_nl_rows(table, index, out, levels, half):
    block_bytes = IQ4_NL_BLOCK_BYTES  # an fp16 scale, then 16 bytes of two 4-bit codes each
    for i in range(index.shape[0]):
        row = table[index[i]]
        values = out[i]
        for b in range(table.shape[1] // block_bytes):
            at = b * block_bytes
            d = half[np.uint16(row[at]) | (np.uint16(row[at + 1]) << 8)]
            for j in range(16):
                code = row[at + 2 + j]
                values[b * 32 + j] = d * levels[code & 15]
                values[b * 32 + 16 + j] = d * levels[code >> 4]


def _decode_float(raw_rows: np.ndarray, ggml_type: int, out: np.ndarray) -> None:
    kind = FLOATS[ggml_type]
    if kind is None:  # bf16: the top half of a float32
        out.view(np.uint32)[...] = raw_rows.view(np.uint16).reshape(out.shape).astype(np.uint32) << 16
    else:
        out[...] = raw_rows.view(kind).reshape(out.shape)


def _decode_piece(table: np.ndarray, ggml_type: int, index: np.ndarray, out: np.ndarray) -> None:
    if ggml_type == IQ4_NL.ggml_type:
        _iq4_nl_rows(table, index, out, *_iq4_nl_tables())
        return
    raw_rows = np.take(table, index, axis=0)
    if ggml_type in FLOATS:
        _decode_float(raw_rows, ggml_type, out)
    else:
        out[...] = dequantize(torch.from_numpy(raw_rows), ggml_type, out.shape).numpy()


def warm(table: np.ndarray, ggml_type: int) -> None:
    """Load the compiled IQ4_NL loop (from numba's cache, or compiling it: ~0.5 s) by decoding row 0, so that a
    model's first prompt does not wait for it at its n-gram layer."""
    if ggml_type == IQ4_NL.ggml_type and table.shape[0]:
        values = table.shape[1] // IQ4_NL.type_size * IQ4_NL.block_size
        decode_rows(table, ggml_type, np.zeros(1, dtype=np.int64), np.empty((1, values), np.float32))


def decode_rows(table: np.ndarray, ggml_type: int, index: np.ndarray, out: np.ndarray) -> None:
    """Rows `index` (int64 [N]) of `table` (uint8 [rows, row_bytes] in format ggml_type) -> out float32 [N, cols],
    which must be C-contiguous (a pinned buffer's numpy view)."""
    if not out.flags.c_contiguous or out.dtype != np.float32 or out.shape[0] != index.shape[0]:
        raise ValueError(f"decode_rows: out must be C-contiguous float32 [{index.shape[0]}, cols]")
    touch_rows(table, index)
    starts = range(0, index.shape[0], PIECE_ROWS)
    if len(starts) <= 1 or PIECE_THREADS == 1:
        for s in starts:
            _decode_piece(table, ggml_type, index[s : s + PIECE_ROWS], out[s : s + PIECE_ROWS])
        return
    pieces = [_pool("piece", PIECE_THREADS).submit(_decode_piece, table, ggml_type, index[s : s + PIECE_ROWS],
                                                   out[s : s + PIECE_ROWS])
              for s in starts]
    for piece in pieces:
        piece.result()
