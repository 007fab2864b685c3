"""zoo.parallel.host_budget: the pipelined host step (HostStep) holds at most its byte budget of
leaf updates in flight on the host, and still equals the whole-tree step bit for bit under a
small budget. The in-flight bytes are counted by an instrument of the test's own (each leaf's
update program wrapped: its bytes counted from its call until its outputs are ready), so a
step that skipped the budget is caught even where the budget's own count would say nothing.
Peak memory figures are the benchmark's (benchmarks/device/RESULTS.md), not a test's."""

import threading
import time

import jax
import pytest

from tests.numerics import assert_bitwise_equal
from tests.parallel.test_host_pipeline import PIECES, engine_for, run
from zoo.parallel.host_budget import ByteBudget, update_bytes
from zoo.parallel.host_leaves import LeafUpdates
from zoo.parallel.host_step import HostStep, SerialHostStep

HOLD_S = 0.05  # each instrumented update lingers, so that updates the budget lets overlap do


class InFlight:
    """The bytes of the leaf updates running at once (XLA's analysis of each program: the
    step's own weight) and their high-water mark."""

    def __init__(self) -> None:
        self.now = self.peak = self.running = self.most_at_once = 0
        self._lock = threading.Lock()

    def wrap(self, program):
        def counted(p, moments, shared, norm, grads):
            nbytes = update_bytes(program, grads)
            with self._lock:
                self.now, self.running = self.now + nbytes, self.running + 1
                self.peak, self.most_at_once = max(self.peak, self.now), max(self.most_at_once, self.running)
            try:
                out = jax.block_until_ready(program(p, moments, shared, norm, grads))
                time.sleep(HOLD_S)
                return out
            finally:
                with self._lock:
                    self.now, self.running = self.now - nbytes, self.running - 1

        return counted


def largest_update(engine, params) -> int:
    """The largest leaf update's bytes (its gradient's and its own)."""
    step = HostStep(engine, chunk_bytes=PIECES)
    run(step, engine, params)
    return max(step.leaf_bytes)


def check_budget(monkeypatch, update_delay: int = 0) -> InFlight:
    engine, params = engine_for("bfloat16", "clipped")
    limit = largest_update(engine, params)
    meter = InFlight()
    compile_leaf = LeafUpdates.compile
    monkeypatch.setattr(LeafUpdates, "compile", lambda self, *a: meter.wrap(compile_leaf(self, *a)))
    step = HostStep(engine, update_delay=update_delay, chunk_bytes=PIECES, inflight_bytes=limit)
    actual = run(step, engine, params)
    assert meter.peak <= limit, (meter.peak, limit)
    assert step.held[0] == limit and step.held[1] <= limit, (step.held, limit)
    if not update_delay:
        assert_bitwise_equal(actual, run(SerialHostStep(engine), engine, params))
    return meter


@pytest.mark.parametrize("update_delay", [0, 1])
def test_a_step_never_holds_more_than_its_budget(update_delay, monkeypatch):
    meter = check_budget(monkeypatch, update_delay)
    assert meter.most_at_once >= 2, meter.most_at_once  # small leaves still overlap under it


def test_the_budget_check_catches_a_budget_not_acquired(monkeypatch):
    monkeypatch.setattr(ByteBudget, "_fits", lambda self, nbytes: True)  # planted
    with pytest.raises(AssertionError):
        check_budget(monkeypatch)


def hold_all(budget: ByteBudget, sizes: list[int], seen: list) -> None:
    """Each of ``sizes`` held from its own thread, started in order; ``seen`` gets the bytes
    held while each one holds."""

    def one(n: int) -> None:
        with budget.hold(n):
            seen.append((n, budget.held))
            time.sleep(HOLD_S)

    threads = []
    for n in sizes:
        threads.append(threading.Thread(target=one, args=(n,), daemon=True))  # a stuck one ends with the test
        threads[-1].start()
        time.sleep(0.005)  # in order: first come, first served
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads), "a hold never came"


def test_a_leaf_larger_than_the_budget_goes_alone_and_the_others_in_turn():
    budget, seen = ByteBudget(10), []
    hold_all(budget, [4, 4, 25, 4, 6], seen)
    assert [n for n, _ in seen] == [4, 4, 25, 4, 6]  # in their order
    assert (25, 25) in seen  # alone
    assert all(held <= 10 for n, held in seen if n != 25), seen
    assert budget.peak == 25 and budget.held == 0


def test_a_bad_budget_is_one_line():
    with pytest.raises(ValueError, match="a byte budget of 0 must be"):
        ByteBudget(0)
    engine, _ = engine_for("float32", "adamw")
    with pytest.raises(ValueError, match="inflight_bytes = 0 must be"):
        HostStep(engine, inflight_bytes=0)


def test_by_default_the_gradient_comes_down_whole_while_the_large_updates_take_turns(monkeypatch):
    """The default budgets: the trips' is the whole gradient's (every leaf's pieces may come down
    at once, as the whole-tree step holds them), the updates' the largest leaf's own, so that
    two of the largest updates never run side by side (on a chip, one budget over both let two
    large leaves in flight and the trips down crawled: benchmarks/device/RESULTS.md)."""
    engine, params = engine_for("bfloat16", "clipped")
    meter = InFlight()
    compile_leaf = LeafUpdates.compile
    monkeypatch.setattr(LeafUpdates, "compile", lambda self, *a: meter.wrap(compile_leaf(self, *a)))
    step = HostStep(engine, chunk_bytes=PIECES)
    actual = run(step, engine, params)
    downs = sorted(step.leaf_downs, reverse=True)
    assert step.budget.limit == sum(downs) and step.updating.limit == max(
        w - d for w, d in zip(step.leaf_bytes, step.leaf_downs, strict=True)
    )
    assert step.budget.peak >= downs[0] + downs[1], (step.budget.peak, downs)  # downs beside an update
    assert step.updating.peak <= step.updating.limit
    assert_bitwise_equal(actual, run(SerialHostStep(engine), engine, params))
