"""Issue 67, item 1: two ``zoo train`` into one ``--out`` at once. The first holds the run
folder's lock (zoo.train.runlock) for its life; a second run, or a ``--resume``, meanwhile is
refused in one line and the first run's files are whole; a lock left by a killed run blocks
nothing.

The first run is a real process that waits, inside its first checkpoint save, until the test
lets it go: the second run is started while the first one is surely alive.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from zoo.cli import main
from zoo.train import checkpoint, runlock

FLAGS = ["digits-mlp", "--set", "train.checkpoint_every=2", "--set", "train.log_every=1", "--no-progress"]

_PAUSED = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from zoo.cli import main
    from zoo.train import checkpoint

    paused, go, save = Path(sys.argv[1]), Path(sys.argv[2]), checkpoint.save

    def paused_save(*args, **kwargs):  # the first save waits for the test's go
        if not paused.exists():
            paused.write_text(str(os.getpid()))
            while not go.exists():
                time.sleep(0.05)
        save(*args, **kwargs)

    checkpoint.save = paused_save
    sys.exit(main(["train", *sys.argv[3:]]))
    """
)
_CLI = "import sys; from zoo.cli import main; sys.exit(main(sys.argv[1:]))"


def paused_run(tmp_path: Path, name: str, *argv: str) -> tuple[subprocess.Popen, Path]:
    """``zoo train *argv`` in a process that stops at its first checkpoint save, started and
    waited for until it stops there; the file whose creation lets it go on."""
    paused, go = tmp_path / f"{name}.paused", tmp_path / f"{name}.go"
    process = subprocess.Popen(
        [sys.executable, "-c", _PAUSED, str(paused), str(go), *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 600
    while not paused.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"the run did not reach its first save: {process.communicate()[1]}")
        time.sleep(0.1)
    return process, go


def logged_steps(out: Path) -> list[int]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [record["step"] for record in map(json.loads, lines) if "loss" in record]


@pytest.mark.slow
def test_a_second_run_into_a_live_runs_folder_is_refused_and_a_killed_runs_lock_is_not(tmp_path, capsys):
    out = tmp_path / "same"
    first, go = paused_run(tmp_path, "first", *FLAGS, "--steps", "4", "--out", str(out))
    assert (out / runlock.LOCK).read_text().strip() == str(first.pid)

    second = subprocess.run(
        [sys.executable, "-c", _CLI, "train", *FLAGS, "--steps", "4", "--seed", "9", "--out", str(out)],
        capture_output=True,
        text=True,
    )
    lines = second.stderr.strip().splitlines()
    assert second.returncode == 2 and len(lines) == 1, second.stderr
    assert lines[0].startswith("error: ") and f"in use by another zoo run (process {first.pid})" in lines[0]
    capsys.readouterr()
    assert main(["train", *FLAGS, "--steps", "4", "--resume", "--out", str(out)]) == 2  # --resume too
    assert "in use by another zoo run" in capsys.readouterr().err

    go.touch()
    assert first.wait(timeout=600) == 0, first.communicate()[1]
    assert logged_steps(out) == [1, 2, 3, 4]  # whole: nobody emptied its metrics.jsonl
    assert checkpoint.saved_steps(out) == [2, 4] and checkpoint.latest_step(out) == 4
    assert json.loads((out / "summary.json").read_text())["steps"] == 4
    assert not (out / runlock.LOCK).exists()

    # A run killed while it holds the lock leaves its lock file; the OS dropped the lock itself.
    killed, _ = paused_run(tmp_path, "killed", *FLAGS, "--steps", "6", "--resume", "--out", str(out))
    killed.kill()
    killed.communicate()
    assert (out / runlock.LOCK).read_text().strip() == str(killed.pid)
    assert main(["train", *FLAGS, "--steps", "6", "--resume", "--out", str(out)]) == 0
    assert checkpoint.latest_step(out) == 6 and logged_steps(out) == [1, 2, 3, 4, 5, 6]
