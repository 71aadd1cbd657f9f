"""A prompt's n-gram rows gathered ahead, on a host thread, while the GPU reads the chunks before them.

qwen4exp's n-gram block (layer 1) needs each chunk's table rows: a hash of the chunk's tokens and 16 rows of the
memory-mapped table a token (~84 MB of float32 for 8,192 tokens). Done in line, the GPU waits for that host work
at every chunk. The rows depend only on the tokens, and the engine knows the whole prompt before its first chunk:
`begin` queues one job a chunk (its position, tokens and the two tokens before it), LOOKAHEAD at a time, on one
worker thread that hashes and decodes into pinned memory; the chunk's forward `take`s its job's rows and copies
them to the device without a host wait.

A job is keyed by everything its rows depend on (position, tokens, the two tokens before): a forward that does not
match the next job (the prompt went another way than announced) ends the plan, and the rows are looked up in line,
so a stale job can never give wrong rows. A job that failed raises its error as a StrataError in the forward that
takes it.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from strata.errors import StrataError

LOOKAHEAD = 2  # jobs queued or running: the next chunk's rows ready while this one computes; pinned memory bounded


@dataclass
class _Job:
    position: int  # of the chunk's first token
    tokens: np.ndarray  # int64 [T]
    previous: tuple[int, int]  # the tokens 2 and 1 back of its first (-1 where none), as the cache holds them
    future: Future | None = None


class NgramPrefetch:
    """Rows of announced prompt chunks, looked up ahead by `lookup(tokens, previous, out)` into float32 [T, width]
    host buffers (pinned where `device` is a GPU)."""

    def __init__(self, lookup, width: int, device: torch.device, source: str = "qwen4exp",
                 lookahead: int = LOOKAHEAD):
        self.lookup, self.width, self.source, self.lookahead = lookup, width, source, lookahead
        device = torch.device(device)
        self.device = device if device.type == "cuda" else None  # pinned buffers where a GPU copies them
        self._executor: ThreadPoolExecutor | None = None
        self.queued: deque[_Job] = deque()  # submitted, in chunk order
        self.waiting: deque[_Job] = deque()  # announced, not yet submitted
        self.taken = 0  # chunks whose rows came from a job (tests and benches read it)
        self.waited_s = 0.0  # host time the forwards spent waiting for a job's rows (bench prompt prints it)

    def begin(self, tokens: list[int], bounds: list[tuple[int, int]], start: int, previous: tuple[int, int],
              min_tokens: int = 1) -> None:
        """The prompt `tokens` (from position `start`, the cache's token window before it `previous`) is about to
        be read in chunks [begin, end) of `bounds`: queue the lookups of those of at least `min_tokens`."""
        self.end()
        window = np.asarray((*previous, *tokens), dtype=np.int64)  # window[b], window[b + 1]: the two before b
        self.waiting = deque(_Job(start + b, window[b + 2 : e + 2], (int(window[b]), int(window[b + 1])))
                             for b, e in bounds if e - b >= max(min_tokens, 1))
        self._fill()

    def take(self, position: int, tokens: np.ndarray, previous: tuple[int, int]) -> torch.Tensor | None:
        """The rows float32 [T, width] (host, pinned when asked) of the chunk at `position` when they were announced
        for exactly these tokens after `previous`; None otherwise (the plan is then dropped: look them up in line).
        Waits for the job if it is still running; its failure raises here."""
        if not self.queued:
            return None
        job = self.queued[0]
        if position + len(tokens) <= job.position:  # a chunk before the next job's, not announced (too small)
            return None
        if (job.position != position or job.previous != tuple(int(t) for t in previous)
                or not np.array_equal(job.tokens, tokens)):
            self.end()
            return None
        self.queued.popleft()
        self._fill()
        started = time.perf_counter()
        try:
            rows = job.future.result()
        except StrataError:
            self.end()
            raise
        except Exception as error:
            self.end()
            last = job.position + len(job.tokens) - 1
            raise StrataError(f"{self.source}: the n-gram table lookup for prompt tokens {job.position}..{last} "
                              f"failed on its host thread: {type(error).__name__}: {error}") from error
        finally:
            self.waited_s += time.perf_counter() - started
        self.taken += 1
        return rows

    def end(self) -> None:
        """Drop the plan: jobs not started are cancelled; a running one finishes and its rows are let go."""
        for job in self.queued:
            job.future.cancel()
        self.queued.clear()
        self.waiting.clear()

    def _fill(self) -> None:
        while self.waiting and len(self.queued) < self.lookahead:
            job = self.waiting.popleft()
            job.future = self._worker().submit(self._run, job)
            self.queued.append(job)

    def _worker(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="strata-ngram")
        return self._executor

    def _run(self, job: _Job) -> torch.Tensor:
        if self.device is None:
            out = torch.empty(len(job.tokens), self.width)
        else:
            with torch.cuda.device(self.device):  # not device 0's context, which a new thread would make current
                out = torch.empty(len(job.tokens), self.width, pin_memory=True)
        self.lookup(job.tokens, job.previous, out)
        return out
