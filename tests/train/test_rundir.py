"""zoo.train.rundir.new_run_dir: the directory a run makes when no --out is given."""

from __future__ import annotations

import time

from zoo.train.rundir import new_run_dir


def _freeze_clock(monkeypatch, stamp: str = "20261206-230604") -> None:
    monkeypatch.setattr(time, "strftime", lambda fmt: stamp if fmt == "%Y%m%d-%H%M%S" else fmt)


def test_two_runs_started_in_the_same_second_get_two_directories(tmp_path, monkeypatch):
    # docs/ghost.md runs `zoo train digits-mlp-dp` twice in a row; with a warm compile cache the
    # first can finish inside a second, and the second then found its checkpoints
    _freeze_clock(monkeypatch)
    first = new_run_dir("digits-mlp-dp", tmp_path)
    assert first == tmp_path / "digits-mlp-dp-20261206-230604"
    first.mkdir()
    second = new_run_dir("digits-mlp-dp", tmp_path)
    assert second == tmp_path / "digits-mlp-dp-20261206-230604-2"
    second.mkdir()
    assert new_run_dir("digits-mlp-dp", tmp_path).name == "digits-mlp-dp-20261206-230604-3"


def test_with_several_processes_the_name_is_the_clocks_alone(tmp_path, monkeypatch):
    # each process names the directory for itself: one that saw another's would pick another name
    _freeze_clock(monkeypatch)
    (tmp_path / "lm-20261206-230604").mkdir()
    assert new_run_dir("lm", tmp_path, only_process=False) == tmp_path / "lm-20261206-230604"


def test_a_damaged_line_is_skipped_with_a_warning_naming_it_and_a_cut_last_line_quietly(tmp_path):
    """``zoo runs`` and ``zoo plot`` read ``metrics.jsonl`` through ``read_records``: a kill can
    cut its last line short (skipped as it is), but a line inside it that is not a step's record
    was skipped too, with nothing said, leaving a gap in the table or plot."""
    import json
    import warnings

    import pytest

    from zoo.train.rundir import read_records

    rows = [json.dumps({"step": s, "loss": 1.0 / s}) for s in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("\n".join([rows[0], '{"step": 2, "lo', rows[2], '{"st']))
    with pytest.warns(
        UserWarning, match=r"metrics.jsonl: skipped 1 line\(s\) that are not a step's record \(line 2\)"
    ):
        assert [r["step"] for r in read_records(tmp_path)] == [1, 3]
    (tmp_path / "metrics.jsonl").write_text("\n".join([*rows, '{"step": 4, "lo']))  # a kill's cut
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [r["step"] for r in read_records(tmp_path)] == [1, 2, 3]
