"""``zoo runs DIR``: every run under DIR with its recipe, steps, last eval and epsilon."""

from __future__ import annotations

import json

from tests.commands.conftest import series
from tests.e2e.clikit import refused
from zoo.cli import main


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
