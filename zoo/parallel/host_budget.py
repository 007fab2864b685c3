"""The host bytes the pipelined host step (:mod:`zoo.parallel.host_step`) holds in flight,
bounded: a weighted semaphore over its leaf updates and trips.

Why: a leaf's update on the host holds, beside the state it updates in place, its gradient's
pieces come down, the program's temporaries (the pieces joined: the leaf again in float32) and
its new value in the compute dtype going up, about 3.5 times the leaf's float32 bytes. A call
of a compiled program returns before the program has run (XLA dispatches asynchronously), so a
thread pool alone bounds nothing: every leaf's update was queued at once, and the host's CPU
client ran as many side by side as it had cores. On a TPU v5e host (llama-1b, four leaves of
about 1 GB float32) that ran 40 GiB of host RAM out, where the whole-tree step fits
(``benchmarks/device/RESULTS.md``). Under a :class:`ByteBudget` each leaf waits for its turn
and its bytes, and holds them until its update and its trip up have finished, so the step's
peak is the state plus the budget, whatever the host's core count. The step splits its bytes
over two budgets (its trips' and its updates') with one :class:`Tally` of what both hold.
"""

from __future__ import annotations

import contextlib
import threading

import jax

FALLBACK_COPIES = 4  # a leaf's float32 bytes held by its update where XLA reports no analysis


class Tally:
    """The bytes held in several budgets at once (:class:`ByteBudget`'s ``tally``), and the most
    ever: what a step that splits its bytes over two budgets held in all."""

    def __init__(self) -> None:
        self.held = 0
        self.peak = 0
        self._lock = threading.Lock()

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.held += nbytes
            self.peak = max(self.peak, self.held)


class ByteBudget:
    """A weighted semaphore, first come first served: :meth:`hold` ``n`` bytes waits until
    its turn and until the bytes held plus ``n`` fit in ``limit``, or nothing else is held (a
    leaf larger than the budget goes alone, never forever). ``peak``: the most bytes ever
    held at once (the tests' check of the bound); ``held``: the bytes held now."""

    def __init__(self, limit: int, tally: Tally | None = None) -> None:
        if limit < 1:
            raise ValueError(f"a byte budget of {limit!r} must be a whole number >= 1")
        self.limit = limit
        self.tally = tally or Tally()  # shared with other budgets, where given
        self.held = 0
        self.peak = 0
        self._turns = 0  # tickets handed out
        self._served = 0  # tickets admitted
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def hold(self, nbytes: int):
        with self._cond:
            ticket, self._turns = self._turns, self._turns + 1
            self._cond.wait_for(lambda: self._served == ticket and self._fits(nbytes))
            self._served += 1
            self.held += nbytes
            self.peak = max(self.peak, self.held)
            self.tally.add(nbytes)
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self.held -= nbytes
                self.tally.add(-nbytes)
                self._cond.notify_all()

    def _fits(self, nbytes: int) -> bool:
        return self.held == 0 or self.held + nbytes <= self.limit


def update_bytes(compiled, grads: tuple) -> int:
    """The host bytes a leaf's update holds beside the state it updates: its gradient's pieces,
    the program's temporaries and its outputs that do not reuse a donated input (the compute-
    dtype pieces that go up; without donation, the new params and moments too). From XLA's
    analysis of the compiled program; where there is none, the leaf's float32 bytes
    ``FALLBACK_COPIES`` times."""
    down = sum(g.size * g.dtype.itemsize for g in grads)
    analysis = compiled.memory_analysis()
    if analysis is None:
        return down * FALLBACK_COPIES
    fresh = analysis.output_size_in_bytes - analysis.alias_size_in_bytes
    return down + analysis.temp_size_in_bytes + max(0, fresh)


def compute_bytes(x: jax.Array, dtype) -> int:
    """``x``'s bytes cast to ``dtype``: a leaf's pieces on the host before their trip up."""
    return x.size * jax.numpy.dtype(dtype).itemsize
