"""Host batches made ahead on a background thread, so that a step does not wait for the disk.

A batch is a function of ``(seed, step)`` (:func:`zoo.train.run.train_batch`), so making it
early changes nothing but when it is read: the thread runs ``make(step)`` for the steps in
order, at most ``depth`` ahead of the loop. The step itself runs in XLA's threads and releases
the interpreter, which is when the thread gathers the next windows.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator

DEPTH = 2  # batches made ahead


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

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _work(self) -> None:
        for step in self.steps:
            if self._stop.is_set():
                return
            try:
                item = (step, self.make(step))
            except BaseException as error:  # handed to the loop, which raises it
                self._put(_Failed(error))
                return
            if not self._put(item):
                return

    def __iter__(self) -> Iterator[tuple[int, object]]:
        for _ in self.steps:
            item = self._queue.get()
            if isinstance(item, _Failed):
                raise item.error
            yield item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def __enter__(self) -> Prefetch:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
