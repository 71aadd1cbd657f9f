"""Rows of the n-gram table decoded straight into a caller's float32 buffer: a prompt chunk's 16 rows a token.

The values are strata.quant.dequantize's to the bit (a float32 scale times a float32 level is one rounding either
way; float formats convert exactly), without its intermediates: the previous gather deduplicated the rows
(np.unique), dequantized them through torch (two shifts, a mask and a 16-level index_select over every value, each
a full-size temporary) and indexed the result again. Here the rows' bytes are taken from the (memory-mapped) table
piece by piece and decoded into the output:

- IQ4_NL (the full-size table's format): each 16-bit word of a block's 16 code bytes is looked up once in a
  65,536-entry table (1 MiB: stays in cache) of its four levels, then those times the block's scale are written in
  ggml's order (the low nibbles are values 0..15, the high ones 16..31); 4x faster than a byte table;
- F32 / F16 / BF16: converted in numpy;
- any other format: strata.quant's dequantize of the piece's rows, copied in.

Pieces of PIECE_ROWS rows spread over a few threads (numpy's take and ufuncs run without the GIL).

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

from strata.quant import dequantize, get_format
from strata.quant.tables import iq4_nl_levels

# Table rows a piece (~14 MB of temporaries): an 8,192-token chunk's 131,072 rows make 8 pieces, 2 a thread, and
# few Python steps (each takes the GIL from the thread launching the GPU's work). check_ngram.py sweeps both.
PIECE_ROWS = 16384
PIECE_THREADS = max(1, min(4, (os.cpu_count() or 1) // 2))  # leave cores to the thread launching the GPU's work
TOUCH_THREADS = 32  # page faults in flight on a cold table: threads that wait on the drive, not on a core
TOUCH_MIN_ROWS = 4096  # below this the threads' dispatch costs more than the overlap can give

IQ4_NL = get_format("IQ4_NL")
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
def _iq4_nl_quads() -> np.ndarray:
    """complex128 [65536] as four float32: the little-endian 16-bit word of bytes (j, j + 1) -> the levels of
    (low nibble of j, low of j + 1, high of j, high of j + 1): values j, j + 1, 16 + j, 17 + j of the block."""
    levels = iq4_nl_levels()
    w = np.arange(1 << 16)
    quads = np.stack([levels[w & 15], levels[(w >> 8) & 15], levels[(w >> 4) & 15], levels[w >> 12]], 1)
    return quads.astype(np.float32).view(np.complex128).reshape(-1)


def _decode_iq4_nl(raw_rows: np.ndarray, out: np.ndarray) -> None:
    blocks = raw_rows.reshape(-1, IQ4_NL.type_size)  # [n, 18]: fp16 scale, 16 bytes of two 4-bit codes each
    scale = np.ascontiguousarray(blocks[:, :2]).view(np.float16).astype(np.float32)  # [n, 1]
    words = np.ascontiguousarray(blocks[:, 2:]).view(np.uint16)  # [n, 8]
    quads = np.take(_iq4_nl_quads(), words).view(np.float32).reshape(-1, 8, 2, 2)  # [n, word, low/high, byte]
    # out's block [low/high half, word, byte]: value (half * 16 + 2 * word + byte).
    np.multiply(quads.transpose(0, 2, 1, 3), scale[:, :, None, None], out=out.reshape(-1, 2, 8, 2))


def _decode_float(raw_rows: np.ndarray, ggml_type: int, out: np.ndarray) -> None:
    kind = FLOATS[ggml_type]
    if kind is None:  # bf16: the top half of a float32
        out.view(np.uint32)[...] = raw_rows.view(np.uint16).reshape(out.shape).astype(np.uint32) << 16
    else:
        out[...] = raw_rows.view(kind).reshape(out.shape)


def _decode_piece(table: np.ndarray, ggml_type: int, index: np.ndarray, out: np.ndarray) -> None:
    raw_rows = np.take(table, index, axis=0)
    if ggml_type == IQ4_NL.ggml_type:
        _decode_iq4_nl(raw_rows, out)
    elif ggml_type in FLOATS:
        _decode_float(raw_rows, ggml_type, out)
    else:
        out[...] = dequantize(torch.from_numpy(raw_rows), ggml_type, out.shape).numpy()


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
