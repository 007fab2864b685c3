"""zoo.train.runlog.MetricsLog out of room: a line of metrics.jsonl that does not fit is one
error line (the file, the cause, the last checkpoint and how to continue), not a traceback, and
the run continues with --resume once there is room. /dev/full fails every write with ENOSPC, as
a full disk does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zoo.cli import main
from zoo.train import checkpoint, runlog

FULL = Path("/dev/full")
pytestmark = pytest.mark.skipif(not FULL.exists(), reason="needs /dev/full")
FLAGS = ["digits-mlp", "--set", "train.checkpoint_every=2", "--set", "train.log_every=1", "--no-progress"]


def test_a_line_that_does_not_fit_is_a_LogWriteError_and_close_stays_quiet(tmp_path):
    log = runlog.MetricsLog(tmp_path / runlog.METRICS)
    log.write({"step": 1, "loss": 2.0})
    log._file.close()
    log._file = FULL.open("a")  # the disk fills up after the first line
    with pytest.raises(runlog.LogWriteError) as raised:
        log.write({"step": 2, "loss": 1.5})
    assert str(raised.value) == (
        f"{tmp_path / runlog.METRICS} could not be written: No space left on device: the disk is full"
    )
    log.close()  # the line still buffered fails again on close: not a second error
    assert [json.loads(line)["step"] for line in (tmp_path / runlog.METRICS).read_text().splitlines()] == [1]


def test_a_run_whose_metrics_do_not_fit_stops_in_one_line_and_resumes(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    assert main(["train", *FLAGS, "--steps", "2", "--out", str(out)]) == 0
    capsys.readouterr()
    opened = runlog.MetricsLog.__init__

    def fills_up(self, path, start=0):
        opened(self, path, start)
        self._file.close()
        self._file = FULL.open("a")

    monkeypatch.setattr(runlog.MetricsLog, "__init__", fills_up)
    assert main(["train", *FLAGS, "--steps", "4", "--resume", "--out", str(out)]) == 2
    said = capsys.readouterr().err
    assert "Traceback" not in said
    line = said[said.index("error: ") :].strip()
    assert len(line.splitlines()) == 1, said
    assert line.startswith(f"error: {out / runlog.METRICS} could not be written: No space left on device"), (
        line
    )
    assert f"the last checkpoint is step 2 in {out}" in line and "--resume" in line, line

    monkeypatch.setattr(runlog.MetricsLog, "__init__", opened)  # room again
    assert main(["train", *FLAGS, "--steps", "4", "--resume", "--out", str(out)]) == 0
    assert checkpoint.latest_step(out) == 4


def test_a_summary_that_does_not_fit_stops_in_one_line_and_a_resume_writes_it(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    written = runlog.atomic_write

    def full_for_the_summary(path, text):
        if path.name == runlog.SUMMARY:
            with FULL.open("w") as f:  # the disk fills up as the summary is written
                f.write(text)
                f.flush()
        written(path, text)

    monkeypatch.setattr(runlog, "atomic_write", full_for_the_summary)
    assert main(["train", *FLAGS, "--steps", "2", "--out", str(out)]) == 2
    said = capsys.readouterr().err
    assert "Traceback" not in said
    line = said[said.index("error: ") :].strip()
    assert len(line.splitlines()) == 1, said
    assert line.startswith(f"error: {out / runlog.SUMMARY} could not be written: No space left on device"), (
        line
    )
    assert f"the last checkpoint is step 2 in {out}" in line and "--resume" in line, line
    assert not (out / runlog.SUMMARY).exists()

    monkeypatch.setattr(runlog, "atomic_write", written)  # room again: the resume only writes it
    assert main(["train", *FLAGS, "--steps", "2", "--resume", "--out", str(out)]) == 0
    assert runlog.read_summary(out)["steps"] == 2


def test_a_json_file_written_out_of_room_leaves_no_temporary_file(tmp_path, monkeypatch):
    def no_room(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(runlog.os, "fsync", no_room)
    with pytest.raises(runlog.LogWriteError, match="the disk is full"):
        runlog.write_json(tmp_path / runlog.SUMMARY, {"a": 1})
    assert list(tmp_path.iterdir()) == []
