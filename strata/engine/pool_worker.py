"""The CPU pool's worker thread: runs the submitted jobs in order and, between two jobs, keeps numba's threads awake
for up to `spin_us` microseconds (empty parallel regions back to back, the worker itself spinning in native code)
instead of letting them sleep: a decode step's layers come ~0.1-1 ms apart, and waking a sleeping team (a futex per
thread) costs tens of microseconds a region.

The decode thread posts a job by bumping a counter the spinning worker reads; the worker leaves its spin at once,
takes the job from the queue and runs it. With `spin_us` 0 the worker sleeps on the queue between jobs.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future

import numpy as np
from numba import njit, prange

from strata.engine.cpu_kernels.gemv import _ONE_AT_A_TIME


@njit(parallel=True, nogil=True, cache=True)
def _touch(flags):
    """One parallel region with next to no work: an item per thread, so each thread of the team takes part."""
    for i in prange(flags.shape[0]):
        flags[i] += 1


@njit(nogil=True, cache=True)
def spin_until_posted(posted, taken, flags, rounds):
    """Empty parallel regions back to back until posted[0] differs from `taken` (a job came; True) or `rounds`
    regions ran (False). posted[0] is written by another thread: the region call between two reads is opaque to the
    compiler, so each round reads it anew."""
    for _ in range(rounds):
        if posted[0] != taken:
            return True
        _touch(flags)
    return posted[0] != taken


class SpinningWorker:
    """One thread running `fn(*args)` jobs in submission order; `setup()` runs first on that thread."""

    def __init__(self, threads: int, spin_us: float, setup, name: str = "strata-cpu-experts"):
        self.threads, self.spin_us = threads, max(0.0, float(spin_us))
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.posted = np.zeros(1, np.int64)  # jobs posted; read by the spinning worker without the GIL
        self.taken = 0
        self.flags = np.zeros(max(1, threads), np.int64)
        self.rounds = 0
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(setup,), name=name, daemon=True)
        self._failed: BaseException | None = None
        self._thread.start()
        self._ready.wait()
        if self._failed is not None:  # setup or calibration raised on the worker: say so here, not hang
            raise self._failed

    def _calibrate(self) -> int:
        """Regions that take about `spin_us` on this team (timed now, after a warm-up)."""
        if self.spin_us <= 0:
            return 0
        n = 400
        with _ONE_AT_A_TIME:
            spin_until_posted(self.posted, self.taken, self.flags, 50)
            start = time.perf_counter()
            spin_until_posted(self.posted, self.taken, self.flags, n)
            per_round = max((time.perf_counter() - start) / n, 1e-7)
        return max(1, int(self.spin_us * 1e-6 / per_round))

    def _run(self, setup) -> None:
        try:
            setup()
            self.rounds = self._calibrate()
        except BaseException as exc:
            self._failed = exc
            return
        finally:
            self._ready.set()
        while True:
            job = self.jobs.get()
            self.taken += 1
            if job is None:
                return
            future, fn, args = job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:  # the caller sees it from future.result()
                    future.set_exception(exc)
            del future, job
            if self.rounds and _ONE_AT_A_TIME.acquire(blocking=False):  # another pool's kernels run: no spin
                try:
                    spin_until_posted(self.posted, self.taken, self.flags, self.rounds)
                finally:
                    _ONE_AT_A_TIME.release()

    def _post(self, job) -> None:
        with self._lock:  # one writer of `posted` at a time; the job is queued before the spin can end
            self.jobs.put(job)
            self.posted[0] += 1

    def submit(self, fn, *args) -> Future:
        future: Future = Future()
        self._post((future, fn, args))
        return future

    def shutdown(self) -> None:
        if self._thread.is_alive():
            self._post(None)
            self._thread.join()
