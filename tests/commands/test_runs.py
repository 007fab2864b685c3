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
