"""``zoo.train.prefetch``: batches made ahead on a thread, in order, errors raised at their step."""

from __future__ import annotations

import threading
import time

import pytest

from zoo.train.prefetch import Prefetch


def test_batches_come_in_step_order_from_another_thread():
    threads = set()

    def make(step):
        threads.add(threading.current_thread().name)
        return step * 10

    with Prefetch(make, range(3, 9)) as batches:
        assert list(batches) == [(s, s * 10) for s in range(3, 9)]
    assert threads == {"zoo-prefetch"}


def test_it_makes_at_most_depth_batches_ahead():
    made = []
    with Prefetch(made.append, range(100), depth=2) as batches:
        next(iter(batches))
        time.sleep(0.2)
        assert len(made) <= 1 + 2 + 1  # the one taken, the queue's two, one waiting to be put


def test_an_error_is_raised_at_its_step_and_stops_the_thread():
    def make(step):
        if step == 2:
            raise OSError("disk gone")
        return step

    got = []
    prefetch = Prefetch(make, range(5))
    with pytest.raises(OSError, match="disk gone"), prefetch:
        for step, _ in prefetch:
            got.append(step)
    assert got == [0, 1] and not prefetch._thread.is_alive()


def test_leaving_early_stops_the_thread():
    prefetch = Prefetch(lambda s: s, range(10_000), depth=1)
    with prefetch:
        for step, _ in prefetch:
            if step == 3:
                break
    assert not prefetch._thread.is_alive()
