"""The interleaved-rounds timer every benchmark shares: what it runs, in which order."""

import argparse
import json
import sys

import numpy as np
import pytest

from tests.numerics import assert_close
from zoo.bench.common import (
    append_row,
    call_stepper,
    median_ratio,
    positive_int,
    ratio_spread,
    run_child,
    time_in_rounds,
    train_command,
)
from zoo.cli import main
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


def test_each_figure_is_the_clocks_seconds_per_timed_step():
    """A fake clock that only the steppers move: stepper ``a`` costs 2 s a step, ``b`` 5 s, so
    every round's figure is exactly that, whatever the untimed steps cost."""
    now = [0.0]
    cost = {"a": 2.0, "b": 5.0}

    def stepper(name):
        def advance(n):
            now[0] += cost[name] * n

        return advance

    times = time_in_rounds({n: stepper(n) for n in cost}, rounds=4, steps_per_round=3, clock=lambda: now[0])
    assert times == {"a": [2.0] * 4, "b": [5.0] * 4}


def test_a_call_stepper_calls_n_times_then_blocks():
    calls = []
    call_stepper(lambda x: calls.append(x) or np.zeros(1), 7)(3)
    assert calls == [7, 7, 7]


# Per-round times with outliers, as a loaded machine gives them; 1, 2, 3, 4, 7 and 11 rounds.
TIMES = [3.1, 2.9, 9.0, 3.3, 3.0, 2.8, 3.6, 3.2, 12.0, 3.05, 2.95]
BASE = [1.0, 1.1, 1.2, 0.9, 1.0, 1.05, 0.95, 1.3, 1.0, 1.02, 0.98]


@pytest.mark.numerics
@pytest.mark.parametrize("rounds", [1, 2, 3, 4, 7, 11])
def test_ratio_spread_is_numpys_median_and_exclusive_quartiles(rounds):
    t, b = TIMES[:rounds], BASE[:rounds]
    spread = ratio_spread(t, b)
    ratios = np.asarray(t, np.float64) / np.asarray(b, np.float64)
    q1, median, q3 = np.percentile(ratios, [25, 50, 75], method="weibull")  # (n+1)p, clamped
    found = np.asarray([spread.q1, spread.median, spread.q3])
    assert_close(found, np.asarray([q1, median, q3]), n=2, what="quartiles of per-round ratios")
    assert median_ratio(t, b) == spread.median
    assert spread.q1 <= spread.median <= spread.q3


def test_ratio_spread_refuses_no_rounds_and_unequal_lengths():
    with pytest.raises(ValueError, match="at least one round"):
        ratio_spread([], [])
    with pytest.raises(ValueError):
        ratio_spread([1.0, 2.0], [1.0])


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


def test_the_child_command_is_zoo_train_json_with_one_set_each():
    cmd = train_command("digits-mlp", "/tmp/out", ["train.seed=3", "train.steps=2"])
    assert cmd == [
        sys.executable, "-m", "zoo.cli", "train", "digits-mlp", "--json", "--no-progress",
        "--out", "/tmp/out", "--set", "train.seed=3", "--set", "train.steps=2",
    ]  # fmt: skip


@pytest.mark.slow
def test_the_child_command_is_one_the_cli_runs(tmp_path, capsys):
    """The builder's arguments, run in-process: ``zoo train`` accepts them and its last stdout
    line is the JSON summary :func:`run_child` reads."""
    cmd = train_command("digits-mlp", tmp_path / "run", ["train.steps=2", "train.seed=1"])
    assert main(cmd[3:]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 2


def test_run_child_reads_the_last_line_and_the_failure(tmp_path):
    ok = run_child([sys.executable, "-c", "print('progress'); print('{\"steps\": 2}')"])
    assert ok.summary == {"steps": 2} and ok.returncode == 0
    assert ok.wall_s > 0 and ok.peak_rss_mib > 0
    failing = [sys.executable, "-c", "import sys; sys.exit('no such recipe')"]
    bad = run_child(failing, check=False)
    assert (bad.summary, bad.returncode) == (None, 1) and "no such recipe" in bad.stderr
    with pytest.raises(SystemExit, match="no such recipe"):
        run_child(failing)
    shown = run_child(train_command("x", "o")[:3] + ["--version"], check=False).command
    assert shown == "zoo --version"


def test_append_row_prints_and_appends_one_line_each(tmp_path, capsys):
    path = tmp_path / "results" / "rows.jsonl"
    append_row(path, {"a": 1})
    append_row(path, {"a": 2})
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"a": 1}, {"a": 2}]
    assert capsys.readouterr().out.splitlines() == ['{"a": 1}', '{"a": 2}']
