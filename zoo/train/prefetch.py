"""Host batches made ahead on a background thread, so that a step does not wait for the disk.

A batch is a function of ``(seed, step)`` (:func:`zoo.train.run.train_batch`), so making it
early changes nothing but when it is read: the thread runs ``make(step)`` for the steps in
order, at most ``depth`` ahead of the loop. The step itself runs in XLA's threads and releases
the interpreter, which is when the thread gathers the next windows.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator

DEPTH = 2  # batches made ahead
CLOSE_WAIT_S = 30.0


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class Prefetch:
    """``for step, batch in Prefetch(make, steps): ...``; leave it (``with``, or ``close()``) to
    stop the thread. An exception in ``make`` is raised in the loop, at the step it was for."""

    def __init__(self, make: Callable[[int], object], steps: range, depth: int = DEPTH) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.make, self.steps = make, steps
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._work, name="zoo-prefetch", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        # No polling: the thread sleeps in put() while the queue is full (close() empties it).
        # A thread that woke on a timer would take a core from the step's own threads.
        for step in self.steps:
            if self._stop.is_set():
                return
            try:
                item = (step, self.make(step))
            except BaseException as error:  # handed to the loop, which raises it
                item = _Failed(error)
            self._queue.put(item)
            if isinstance(item, _Failed):
                return

    def __iter__(self) -> Iterator[tuple[int, object]]:
        for _ in self.steps:
            item = self._queue.get()
            if isinstance(item, _Failed):
                raise item.error
            yield item

    def close(self) -> None:
        """Stop the thread: it finishes the batch it is making, if any, and ends."""
        self._stop.set()
        deadline = time.monotonic() + CLOSE_WAIT_S  # a batch stuck on the disk: leave the daemon
        while self._thread.is_alive() and time.monotonic() < deadline:
            try:
                self._queue.get_nowait()  # room for a put the thread may be waiting in
            except queue.Empty:
                pass
            self._thread.join(timeout=0.01)

    def __enter__(self) -> Prefetch:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
