"""Host work done while the host waits for the device: short pieces run one at a time between polls of the event
the host awaits (a streamed prompt's routing read at every layer, engine/prefill_stream.py).

The piece it exists for: pinning the host memory of the checkpoint that a hybrid model's cache gets at a prompt's
end (CheckpointStore.reserve_pieces) during the prompt instead of after it, where the first token waited for it
(on the H200, 39-104 ms of a 4K prompt and 160-361 ms of a 32K one: torch's pinned allocations map and lock fresh
pages). The host waits ~6 ms a layer for the routing there; a piece pins one slab of 8-16 MiB (~1.5-3 ms when
nothing else runs). A piece under way when the event fires delays what follows the wait by its rest; the ring holds
the next layer's copies queued ahead, so the link stays busy meanwhile. Allocating on another thread instead slowed
the main thread's kernel launches 3.6x (session 12).

Opt-in (STRATA_CHECKPOINT_AHEAD=1): on the H200 (full qwen4exp at 12 GiB, session 13) the slabs took ~3x longer to
pin during the prompt than after it (148.6 ms for 294 MB at 4K, 506 ms for 1,342 MB at 32K; 16 MiB slabs, ~8.5 ms
each against ~4-5 ms waits): the save's host time fell to 4-5 ms, the prompt was no faster at 4K (0.902 s) and
slower at 32K (5.14 s against 4.69-4.87 in earlier first processes).
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Iterable


class IdleWork:
    def __init__(self):
        self.pieces: deque[Callable[[], None]] = deque()
        self.done = 0  # pieces run so far (their host time: whoever made them counts it, e.g. CheckpointStats)

    def add(self, pieces: Iterable[Callable[[], None]]) -> None:
        self.pieces.extend(pieces)

    def clear(self) -> None:
        """Drop the pieces not run (the work they stood for happens where it is needed, as without them)."""
        self.pieces.clear()

    def wait(self, event) -> None:
        """Run pieces while `event` (a CUDA event, or anything with query() and synchronize()) has not fired, then
        wait for it."""
        while self.pieces and not event.query():
            self.pieces.popleft()()
            self.done += 1
        event.synchronize()
