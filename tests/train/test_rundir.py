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
