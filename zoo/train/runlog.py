"""A run directory's files besides the checkpoints: ``metrics.jsonl``, ``recipe.json``,
``summary.json``, and the progress bar. Effects only; the training math never sees them."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from zoo.train.save_guard import RunWriteError, os_cause

METRICS = "metrics.jsonl"
RECIPE = "recipe.json"
SUMMARY = "summary.json"


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` so that a reader, or a run killed at any point, sees the old file or the
    new one, never a part: a synced temporary file renamed over ``path``, then the folder synced."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with tmp.open("w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk: no half-written temporary file left behind
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def dir_problem(out: Path, retries: int = 3) -> str | None:
    """Why ``out`` cannot be a directory zoo writes into, or None. Tried, not guessed: the
    missing folders are made and a temporary file written in ``out``, then all of it removed,
    so a run refused later leaves nothing behind."""
    out = Path(os.path.abspath(out))
    missing, parent = [], out
    made = []  # only the folders this call made are removed: many processes may probe at once
    try:
        while not os.path.exists(parent) and parent != parent.parent:  # False, not raised, for a long name
            missing.append(parent)
            parent = parent.parent
        if not os.path.isdir(parent):
            return "it is a file" if parent == out else f"{parent} is a file, not a directory"
        for folder in reversed(missing):
            try:
                folder.mkdir()
                made.append(folder)
            except FileExistsError:
                pass
        with tempfile.TemporaryFile(dir=out):
            pass
    except FileNotFoundError as error:  # another process removed its probe folders: try again
        if retries:
            return dir_problem(out, retries - 1)
        return _os_reason(error, parent, out)
    except OSError as error:
        return _os_reason(error, parent, out)
    finally:
        for folder in reversed(made):  # innermost first
            with contextlib.suppress(OSError):
                folder.rmdir()
    return None


def _os_reason(error: OSError, parent: Path, out: Path) -> str:
    reason = error.strerror or str(error)
    if error.errno == errno.ENAMETOOLONG:
        longest = max(len(part.encode()) for part in out.parts)
        return f"a name of {longest} bytes is longer than the {os.pathconf(parent, 'PC_NAME_MAX')} {parent} allows"
    if error.errno == errno.ENOENT:  # /proc and its kind refuse new folders this way
        return f"{parent} does not take new folders ({reason})"
    return f"{parent} is not writable ({reason})"


def write_json(path: Path, obj: object) -> None:
    """``obj`` as ``path``, whole or not at all; out of room, a :class:`LogWriteError`."""
    try:
        atomic_write(path, json.dumps(obj, indent=2) + "\n")
    except OSError as error:
        raise LogWriteError(f"{path} could not be written: {os_cause(error) or error}") from None


def read_summary(run_dir: Path) -> dict | None:
    path = Path(run_dir) / SUMMARY
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class MetricsLog:
    """``metrics.jsonl`` writer: one JSON object per line, flushed as it goes.

    Opened at ``start > 0`` (a resumed run), it first drops the lines of steps after
    ``start``: those steps run again, and their lines would otherwise appear twice.
    """

    def __init__(self, path: Path, start: int = 0) -> None:
        if start and path.exists():
            kept = [line for line in path.read_text().splitlines() if _step_of(line) <= start]
            atomic_write(path, "".join(line + "\n" for line in kept))
        elif not start:
            path.unlink(missing_ok=True)
        self._path, self._failed = path, False
        self._file = path.open("a")

    def write(self, record: dict) -> None:
        try:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        except OSError as error:  # a full disk: one line, and the run stops as a checkpoint's would
            self._failed = True
            raise LogWriteError(f"{self._path} could not be written: {os_cause(error) or error}") from None

    def close(self) -> None:
        if self._failed:  # closing flushes the line that did not fit again: it fails the same way
            with contextlib.suppress(OSError):
                self._file.close()
            return
        self._file.close()


class LogWriteError(RunWriteError):
    """A line of ``metrics.jsonl``, or ``recipe.json`` or ``summary.json``, could not be written;
    what was written before it and the checkpoints are intact."""


class NullLog:
    """The metrics log of a process that does not write (all but process 0)."""

    def write(self, record: dict) -> None:
        pass

    def close(self) -> None:
        pass


def _step_of(line: str) -> float:
    try:
        return float(json.loads(line).get("step", 0))
    except (ValueError, AttributeError):
        return float("inf")  # a line cut short by a kill: drop it


def progress_bar(console: Console, rate_unit: str | None = "ex/s") -> Progress:
    """The bar of a run's steps: its loss and its rate in ``rate_unit`` (the audit counts
    steps a second; None: the rate's text carries its unit, as training's does, tokens a
    second and MFU: zoo.train.pace)."""
    return Progress(
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TextColumn("{task.fields[rate]}" + (f" {rate_unit}" if rate_unit else "")),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )
