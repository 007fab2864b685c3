"""The interleaved-rounds timer every benchmark shares: what it runs, in which order."""

import argparse

import pytest

from zoo.bench.common import median_ratio, positive_int, time_in_rounds
from zoo.errors import ZooError


def test_steppers_take_turns_and_take_an_untimed_step_each_round():
    calls = []
    steppers = {name: (lambda n, name=name: calls.append((name, n))) for name in ("a", "b")}
    times = time_in_rounds(steppers, rounds=3, steps_per_round=2)
    warm_up = [("a", 1), ("b", 1)]
    one_round = [("a", 1), ("a", 2), ("b", 1), ("b", 2)]
    assert calls == warm_up + 3 * one_round
    assert {name: len(t) for name, t in times.items()} == {"a": 3, "b": 3}
    assert all(t >= 0 for ts in times.values() for t in ts)


def test_median_ratio_pairs_rounds():
    # per-round ratios 2, 3, 10 -> median 3; the ratio of medians would be 20 / 5 = 4
    assert median_ratio([2.0, 30.0, 20.0], [1.0, 10.0, 2.0]) == 3.0


@pytest.mark.parametrize("rounds,steps", [(0, 1), (3, 0)])
def test_no_rounds_or_no_steps_is_an_error(rounds, steps):
    with pytest.raises(ZooError, match=f"rounds={rounds}.*steps per round={steps}"):
        time_in_rounds({"a": lambda n: None}, rounds, steps)


def test_positive_int_flag_type():
    assert positive_int("5") == 5
    for bad, match in (("0", "at least 1, got 0"), ("x", "got 'x'")):
        with pytest.raises(argparse.ArgumentTypeError, match=match):
            positive_int(bad)


def test_engine_bench_times_both_steps_in_rounds():
    from zoo.bench.engine import bench_engine

    row = bench_engine("digits-mlp", "nnx", steps=1, repeats=2)
    assert (row["repeats"], row["steps_per_repeat"]) == (2, 1)
    assert row["zoo_step_ms"] > 0 and row["hand_step_ms"] > 0 and row["ratio"] > 0
