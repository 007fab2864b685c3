"""``zoo runs DIR``: every run under DIR with its recipe, steps, last eval and epsilon."""

from __future__ import annotations

import json
import shutil

from tests.commands.conftest import GROUP, series
from tests.e2e.clikit import refused
from zoo.cli import main
from zoo.train import manifest

pytestmark = GROUP  # the runs fixture's worker (tests/commands/conftest.py)


def test_runs_lists_every_run_with_its_facts(runs, capsys):
    assert main(["runs", str(runs), "--json"]) == 0
    rows = {row["recipe"]: row for row in json.loads(capsys.readouterr().out.strip().splitlines()[-1])}
    assert set(rows) == {"digits-mlp", "digits-mlp-dp"}
    assert rows["digits-mlp"]["steps_done"] == 6 and rows["digits-mlp-dp"]["steps_done"] == 4
    assert rows["digits-mlp"]["epsilon"] is None
    assert rows["digits-mlp-dp"]["epsilon"] == series(runs / "digits-mlp-dp", "epsilon")[1][-1]
    assert (
        rows["digits-mlp"]["last_eval"]["eval_accuracy"]
        == series(runs / "digits-mlp", "eval_accuracy")[1][-1]
    )
    assert main(["runs", str(runs)]) == 0
    assert "digits-mlp-dp" in capsys.readouterr().out


def test_a_missing_file_or_empty_folder_is_refused_in_one_line(capsys, tmp_path):
    refused(capsys, ["runs", str(tmp_path / "nope")], "does not exist", "nope")
    (tmp_path / "file").write_text("")
    refused(capsys, ["runs", str(tmp_path / "file")], "is a file")
    (tmp_path / "none").mkdir()
    refused(capsys, ["runs", str(tmp_path / "none")], "holds no run")


def test_a_run_in_progress_with_an_empty_metrics_log_is_listed(capsys, tmp_path):
    """Issue 60, item 10: a run that has logged no step yet was left out (an empty table, ``[]``)."""
    from zoo.train import runlog

    run = tmp_path / "going"
    run.mkdir()
    (run / runlog.METRICS).write_text("")
    (run / runlog.RECIPE).write_text(json.dumps({"name": "digits-mlp", "train": {"steps": 5}}))
    assert main(["runs", str(tmp_path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [(r["run"], r["recipe"], r["steps_done"], r["steps"], r["finished"]) for r in rows] == [
        (str(run), "digits-mlp", 0, 5, False)
    ]
    assert main(["runs", str(tmp_path)]) == 0
    assert "0/5 (not finished)" in capsys.readouterr().out


def test_the_checkpoint_column_says_which_step_a_run_can_be_loaded_from(runs, capsys, tmp_path):
    """A run whose checkpoints were deleted or damaged read as finished ("6/6") with nothing
    beside it to say that `eval`, `sample` and `--resume` would refuse it."""
    run = shutil.copytree(runs / "digits-mlp", tmp_path / "runs" / "run")

    def row() -> tuple:
        assert main(["runs", str(tmp_path / "runs"), "--json"]) == 0
        (found,) = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert main(["runs", str(tmp_path / "runs")]) == 0
        table = capsys.readouterr().out
        return found["checkpoint"], found["checkpoints_saved"], table

    saved = manifest.saved_steps(run)
    assert saved and saved[-1] == 6, saved
    assert row()[:2] == (6, saved)
    # the newest step's largest file cut short: the step before it, as loading would take
    newest = manifest.step_dir(run, 6)
    biggest = max(
        (p for p in newest.rglob("*") if p.is_file() and p.name != manifest.MANIFEST),
        key=lambda p: p.stat().st_size,
    )
    biggest.write_bytes(biggest.read_bytes()[:-1])
    assert manifest.step_problem(run, 6) is not None  # the loader's own check agrees
    expected = saved[-2] if len(saved) > 1 else None
    checkpoint, _, table = row()
    assert checkpoint == expected
    # every step damaged, then none left
    for step in saved[:-1]:
        (manifest.step_dir(run, step) / manifest.MANIFEST).unlink()
    checkpoint, _, table = row()
    assert checkpoint is None and "damaged" in table and "6/6" in table, table
    shutil.rmtree(run / manifest.CHECKPOINT_DIR)
    checkpoint, now_saved, table = row()
    assert (checkpoint, now_saved) == (None, []) and "damaged" not in table, table


def test_the_time_column_is_the_runs_elapsed_sec_over_every_segment(capsys, tmp_path):
    """The column read "wall time" (JSON ``wall_time_sec``) and showed the last logged
    ``elapsed_sec``: the training loop's clock, whose segments a resume sums (the second
    segment's lines continue the first's) but which leaves out each segment's start-up, the
    last checkpoint write and the gaps between segments. It is named for what it is."""
    from zoo.train import runlog

    run = tmp_path / "resumed"
    run.mkdir()
    first = [{"step": 2, "loss": 1.0, "elapsed_sec": 1.5}, {"step": 4, "loss": 0.9, "elapsed_sec": 3.0}]
    second = [
        {"step": 6, "loss": 0.8, "elapsed_sec": 4.25},
        {"step": 6, "eval_loss": 0.7, "elapsed_sec": 125.5},
    ]
    (run / runlog.METRICS).write_text("".join(json.dumps(r) + "\n" for r in first + second))
    (run / runlog.RECIPE).write_text(json.dumps({"name": "digits-mlp", "train": {"steps": 6}}))
    (run / runlog.SUMMARY).write_text(
        json.dumps({"recipe": "digits-mlp", "wall_sec": 2.0, "resumed_from_step": 4})
    )
    assert main(["runs", str(tmp_path), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["elapsed_sec"] == 125.5 and "wall_time_sec" not in row
    assert main(["runs", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "elapsed" in table and "wall time" not in table and "2m06s" in table, table
