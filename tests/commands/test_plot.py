"""``zoo plot``: a DP and a non-DP run on one figure, a run in progress; a run directory that
is missing or empty is refused in one line."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image
import pytest

from tests.commands.conftest import GROUP, series
from tests.e2e.clikit import refused
from zoo.cli import main
from zoo.commands.plot import plot_runs, run_labels
from zoo.train.rundir import load_run

pytestmark = GROUP  # the runs fixture's worker (tests/commands/conftest.py)


def test_a_dp_and_a_non_dp_run_on_one_figure(runs, tmp_path):
    plain, dp = runs / "digits-mlp", runs / "digits-mlp-dp"
    out = tmp_path / "both.png"
    drawn = plot_runs([load_run(plain), load_run(dp)], out)
    assert matplotlib.image.imread(out).shape[:2][0] > 100  # a PNG that reads back
    assert set(drawn) == {
        (str(plain), "loss"),
        (str(plain), "eval_loss"),
        (str(dp), "eval_loss"),  # no training loss under DP: it is not released
        (str(dp), "epsilon"),
    }
    for run_dir, key in drawn:
        assert drawn[(run_dir, key)] == series(runs / run_dir.rsplit("/", 1)[1], key)
    assert main(["plot", str(plain), str(dp), "--x", "time", "--out", str(tmp_path / "t.png")]) == 0


def test_a_run_in_progress_is_plotted_from_what_it_logged(runs, tmp_path):
    partial = tmp_path / "partial"
    partial.mkdir()
    lines = (runs / "digits-mlp" / "metrics.jsonl").read_text().splitlines()
    (partial / "recipe.json").write_text((runs / "digits-mlp" / "recipe.json").read_text())
    (partial / "metrics.jsonl").write_text("\n".join(lines[:3]) + '\n{"step": 4, "lo')  # cut by a kill
    drawn = plot_runs([load_run(partial)], tmp_path / "p.png")
    assert drawn[(str(partial), "loss")][0] == [1, 2]
    assert load_run(partial).steps_done == 2


def test_missing_or_empty_run_directories_are_refused_in_one_line(capsys, tmp_path):
    png = str(tmp_path / "x.png")
    refused(capsys, ["plot", str(tmp_path / "nope"), "--out", png], "does not exist", "nope")
    (tmp_path / "empty").mkdir()
    refused(capsys, ["plot", str(tmp_path / "empty"), "--out", png], "no metrics.jsonl", "empty")
    (tmp_path / "empty" / "metrics.jsonl").write_text("")
    refused(capsys, ["plot", str(tmp_path / "empty"), "--out", png], "an empty metrics.jsonl")


def test_runs_of_the_same_folder_name_get_legend_labels_that_tell_them_apart(runs, tmp_path, monkeypatch):
    import shutil

    import matplotlib.pyplot as plt

    for parent in ("a", "b"):
        shutil.copytree(runs / "digits-mlp", tmp_path / parent / "run")
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)  # the figure, kept to read its legend
    plot_runs([load_run(tmp_path / "a" / "run"), load_run(tmp_path / "b" / "run")], tmp_path / "ab.png")
    legend = [t.get_text() for t in figures[0].axes[0].get_legend().get_texts()]
    assert legend == ["a/run loss", "a/run eval_loss", "b/run loss", "b/run eval_loss"]
    paths = [tmp_path / "x", tmp_path / "a" / "run", tmp_path / "b" / "run", tmp_path / "x"]
    assert run_labels(paths) == ["x", "a/run", "b/run", "x (2)"]


@pytest.mark.parametrize("where", ["a directory", "under a file", "a 300-character name", "/proc"])
def test_an_out_path_that_cannot_be_written_is_refused_in_one_line(runs, capsys, tmp_path, where):
    """Issue 60, item 7: each of these ended in a traceback (FileNotFoundError, FileExistsError,
    IsADirectoryError, OSError) after the figure was drawn."""
    (tmp_path / "folder.png").mkdir()
    (tmp_path / "file").write_text("")
    out = {
        "a directory": tmp_path / "folder.png",
        "under a file": tmp_path / "file" / "x.png",
        "a 300-character name": tmp_path / ("a" * 300 + ".png"),
        "/proc": Path("/proc/zoo-plot-test.png"),
    }[where]
    if where == "/proc" and not Path("/proc").is_dir():
        pytest.skip("no /proc here")
    refused(capsys, ["plot", str(runs / "digits-mlp"), "--out", str(out)], "--out", "cannot write the figure")
