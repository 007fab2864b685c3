"""Issue 67, item 3: a checkpoint write that runs out of room. Under a file-size limit
(``ulimit -f``; a full disk fails the same write with ENOSPC instead of EFBIG) a run ended in
exit 1 with dozens of tracebacks and ``ERROR:absl`` lines and left
``checkpoints/N.orbax-checkpoint-tmp``. Now: one line naming the folder and the cause, the last
good checkpoint intact, nothing half-written left, and ``--resume`` works once there is room."""

from __future__ import annotations

import subprocess
import sys

import pytest

from zoo.cli import main
from zoo.train import checkpoint

LIMIT = 64 * 1024  # bytes a file may hold: the run's files fit, a digits-mlp step's arrays do not
FLAGS = ["digits-mlp", "--set", "train.checkpoint_every=2", "--set", "optim.warmup_steps=0", "--no-progress"]


# `zoo` under `ulimit -f`: the limit set first, then the CLI (Python ignores SIGXFSZ, so a write
# past the limit fails with EFBIG instead of killing the process).
_LIMITED = (
    "import resource, sys; "
    f"resource.setrlimit(resource.RLIMIT_FSIZE, ({LIMIT}, resource.getrlimit(resource.RLIMIT_FSIZE)[1])); "
    "from zoo.cli import main; sys.exit(main(sys.argv[1:]))"
)


@pytest.mark.slow
def test_a_checkpoint_write_out_of_room_is_one_line_and_leaves_the_last_good_step(tmp_path, capsys):
    out = tmp_path / "r98"
    assert main(["train", *FLAGS, "--steps", "2", "--out", str(out)]) == 0
    assert checkpoint.latest_step(out) == 2

    limited = subprocess.run(
        [sys.executable, "-c", _LIMITED, "train", *FLAGS, "--steps", "4", "--resume", "--out", str(out)],
        capture_output=True,
        text=True,
    )
    said = limited.stderr
    assert limited.returncode == 2, said[-3000:]
    for noise in ("Traceback", "ERROR:absl", "Exception ignored", "Event loop is closed"):
        assert noise not in said, said[-3000:]
    before, _, line = said.partition("error: ")  # the resume's own notice, then one error line
    assert before.startswith("resuming from step 2") and len(line.strip().splitlines()) == 1, said
    where = str((out / checkpoint.CHECKPOINT_DIR).absolute())
    assert line.startswith(f"checkpoint step 4 could not be written in '{where}': File too large"), line
    assert "ulimit -f" in line and "the last checkpoint is step 2" in line and "--resume" in line
    assert checkpoint.saved_steps(out) == [2] and checkpoint.step_problem(out, 2) is None
    assert not list(out.rglob("*orbax-checkpoint-tmp*"))

    capsys.readouterr()
    assert main(["train", *FLAGS, "--steps", "4", "--resume", "--out", str(out)]) == 0  # room again
    assert checkpoint.latest_step(out) == 4
