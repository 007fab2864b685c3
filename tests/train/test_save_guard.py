"""zoo.train.save_guard and a failed checkpoint.save: the cause read off the error, the reports
of orbax's threads kept during a save (given back when it succeeds, dropped with their late
echoes when it fails), and nothing half-written left. The real full disk is in
tests/e2e/test_full_disk.py."""

from __future__ import annotations

import errno
import logging
import sys
import types

import pytest

from zoo.train import checkpoint, save_guard
from zoo.train.save_guard import CheckpointWriteError, held_reports, os_cause


@pytest.fixture
def restored(monkeypatch):
    """A failed save changes the process's reporting for good: undone after each test."""
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    for name in save_guard.LOGGERS:
        monkeypatch.setattr(logging.getLogger(name), "filters", list(logging.getLogger(name).filters))
    monkeypatch.setattr(save_guard, "_FAILED", set())


def test_the_cause_is_the_operating_systems_reason_or_none():
    assert os_cause(OSError(errno.ENOSPC, "x")) == "No space left on device: the disk is full"
    tensorstore = ValueError(
        "OUT_OF_RANGE: Failed to write 8 bytes to file 9: File too large [os_error_code='27']"
    )
    assert os_cause(tensorstore) == "File too large: a file-size limit (ulimit -f) was reached"
    assert os_cause(ValueError("a bug")) is None


def test_a_saves_reports_come_back_when_it_succeeds(restored, caplog):
    with held_reports("/run/checkpoints/2.orbax-checkpoint-tmp"):
        logging.getLogger("absl").error("a report of a save that went well")
        assert "went well" not in caplog.text
    assert "went well" in caplog.text


def _unraisable(error, obj=None):
    return types.SimpleNamespace(
        exc_type=type(error), exc_value=error, exc_traceback=None, err_msg=None, object=obj
    )


def test_a_failed_saves_reports_and_their_late_echoes_are_dropped_and_no_other(restored, caplog):
    folder = "/run/checkpoints/4.orbax-checkpoint-tmp"
    with pytest.raises(OSError), held_reports(folder):
        logging.getLogger("absl").error("a thread's error")
        raise OSError(errno.EFBIG, "File too large")
    assert "a thread's error" not in caplog.text
    logging.getLogger("asyncio").error(
        f"_GatheringFuture exception was never retrieved: writing {folder}/d/1"
    )
    logging.getLogger("asyncio").error("a report of something else")
    assert folder not in caplog.text and "something else" in caplog.text
    seen = []
    sys.unraisablehook.hook = lambda u: seen.append(u.exc_value)
    sys.unraisablehook(_unraisable(RuntimeError("Event loop is closed")))
    other = RuntimeError("another")
    sys.unraisablehook(_unraisable(other))
    assert seen == [other]


class _FailingManager:
    """orbax's CheckpointManager whose save leaves its temporary folder and raises ``error``."""

    def __init__(self, error):
        self.error = error

    def __call__(self, run_dir, create, item_handlers=None):
        self.root = run_dir.absolute() / checkpoint.CHECKPOINT_DIR
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def save(self, step, args, force):
        (self.root / f"{step}.orbax-checkpoint-tmp" / "params").mkdir(parents=True)
        raise self.error


@pytest.mark.parametrize(
    "error, raised",
    [
        (ValueError("Failed writing: No space left on device [os_error_code=28]"), CheckpointWriteError),
        (TypeError("a bug"), TypeError),
    ],
    ids=["disk", "bug"],
)
def test_a_failed_save_leaves_nothing_and_says_why_or_keeps_a_bugs_traceback(
    restored, tmp_path, monkeypatch, error, raised
):
    monkeypatch.setattr(checkpoint, "_manager", _FailingManager(error))
    with pytest.raises(raised) as caught:
        checkpoint.save(tmp_path / "run", 4, None, {"w": 1.0}, {})
    if raised is CheckpointWriteError:
        where = tmp_path / "run" / checkpoint.CHECKPOINT_DIR
        assert (
            str(caught.value)
            == f"checkpoint step 4 could not be written in '{where}': No space left on device: the disk is full"
        )
    assert list((tmp_path / "run" / checkpoint.CHECKPOINT_DIR).iterdir()) == []
