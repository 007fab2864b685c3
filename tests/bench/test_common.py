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


def test_a_scatter_plot_labels_coincident_points_once(tmp_path):
    """Policies with the same temp memory and step time share a marker spot: one label names
    them all, and every label's text stays clear of every other label."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from zoo.bench.common import _merge_coincident, _place_labels, scatter_plot

    points = [
        ("none", 190.0, 150.0),
        ("full", 48.7, 102.0),
        ("recursive", 48.7, 102.1),
        ("dots", 65.4, 104.0),
    ]
    fig, ax = plt.subplots()
    for _, x, y in points:
        ax.scatter([x], [y])
    ax.set_xlim(0, 240)
    ax.set_ylim(0, 170)
    merged, colors = _merge_coincident(ax, points, ["C0", "C1", "C2", "C3"])
    assert [p[0] for p in merged] == ["none", "full, recursive", "dots"]
    assert colors == ["C0", "dimgray", "C3"]
    _place_labels(fig, ax, merged, colors)
    renderer = fig.canvas.get_renderer()
    boxes = [matplotlib.text.Text.get_window_extent(t, renderer) for t in ax.texts]
    assert len(boxes) == 3 and not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
    plt.close(fig)
    assert scatter_plot(str(tmp_path / "p.png"), points, xlabel="x", ylabel="y", title="t").endswith("p.png")
