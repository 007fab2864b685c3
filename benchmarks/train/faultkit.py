"""Kill a real `zoo train` process in the middle of a checkpoint write, then resume it.

Shared by ``tests/e2e/test_faults.py`` (a couple of kills) and ``benchmarks/train/faults.py`` (the
20-kill tally in docs/recipes.md).

The victim is a subprocess running the real CLI. Its ``checkpoint.save`` is wrapped so that
every save is timed, and at the save of ``KILL_STEP`` a timer thread sends SIGKILL to the
process after ``fraction`` x the duration of the save before it: a random point of the write (orbax's temporary
directory, its rename, the manifest), or just after it when the fraction exceeds 1. The
parent then records what the kill left on disk and resumes the run with ``--resume``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np

from zoo.train import checkpoint

STEPS, EVERY, KILL_STEP = 40, 10, 30
FLAGS = ["digits-mlp", "--steps", str(STEPS), "--set", f"train.checkpoint_every={EVERY}", "--no-progress"]

_VICTIM = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    from zoo.cli import main
    from zoo.train import checkpoint, runlog

    mode, step_at, fraction = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    # Ctrl-C as at a terminal, even when this suite was started in the background (whose
    # children inherit an ignored SIGINT).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    save, write, timing = checkpoint.save, runlog.MetricsLog.write, {}

    def timed_save(run_dir, step, *args, **kwargs):
        if step == step_at:
            delay = fraction * timing["last"]
            threading.Timer(delay, os.kill, (os.getpid(), signal.SIGKILL)).start()
        tic = time.perf_counter()
        save(run_dir, step, *args, **kwargs)
        timing["last"] = time.perf_counter() - tic
        if step == step_at:
            time.sleep(10)  # the timer fires in here when fraction > 1

    def interrupting_write(self, record):
        write(self, record)
        if record.get("step") == step_at:  # Ctrl-C: a SIGINT, like a terminal sends
            os.kill(os.getpid(), signal.SIGINT)

    def killing_manifest(step_dir):  # orbax's step is complete, its manifest not yet written
        if step_dir.name == str(step_at):
            os.kill(os.getpid(), signal.SIGKILL)
        manifest(step_dir)

    if mode == "kill-save":
        checkpoint.save = timed_save
    elif mode == "kill-manifest":
        manifest, checkpoint.write_manifest = checkpoint.write_manifest, killing_manifest
    else:
        runlog.MetricsLog.write = interrupting_write
    sys.exit(main(["train", *sys.argv[4:]]))
    """
)


def victim(mode: str, step: int, fraction: float, *argv: str) -> subprocess.CompletedProcess:
    """Run ``zoo train *argv`` in a subprocess that is killed during the save of ``step``
    (``"kill-save"``: after ``fraction`` of a save's duration; ``"kill-manifest"``: after orbax
    finished the step, before its manifest) or interrupted (``"sigint-log"``: a SIGINT right
    after the metrics line of ``step``)."""
    return subprocess.run(
        [sys.executable, "-c", _VICTIM, mode, str(step), str(fraction), *argv],
        capture_output=True,
        text=True,
        timeout=300,
    )


def run_reference(out: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "zoo.cli", "train", *FLAGS, "--out", str(out)],
        check=True,
        capture_output=True,
        timeout=300,
    )


def kill_during_save(out: Path, fraction: float, mode: str = "kill-save") -> str:
    """Run the victim until the kill; return what the killed save left: ``"no step dir"``,
    ``"damaged: ..."`` or ``"intact"`` (the kill landed after the write had finished)."""
    killed = victim(mode, KILL_STEP, fraction, *FLAGS, "--out", str(out))
    if killed.returncode != -signal.SIGKILL:
        raise AssertionError(f"victim was not killed (exit {killed.returncode}):\n{killed.stderr[-2000:]}")
    step_dir = out / checkpoint.CHECKPOINT_DIR / str(KILL_STEP)
    if not step_dir.is_dir():
        return "no step dir"
    problem = checkpoint.step_problem(out, KILL_STEP)
    return "intact" if problem is None else f"damaged: {problem}"


def resume(out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "zoo.cli", "train", *FLAGS, "--out", str(out), "--resume", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )


def same_params(a: Path, b: Path) -> bool:
    pa, pb = checkpoint.load_checkpoint(a).params, checkpoint.load_checkpoint(b).params
    leaves = jax.tree_util.tree_leaves(jax.tree_util.tree_map(np.array_equal, pa, pb))
    return bool(leaves) and all(leaves)


def one_trial(workdir: Path, reference: Path, fraction: float, mode: str = "kill-save") -> dict:
    """Kill, resume, compare with the reference run; a JSON-ready record."""
    out = workdir / f"{mode}-{fraction:.3f}-{os.getpid()}"
    left = kill_during_save(out, fraction, mode)
    resumed = resume(out)
    ok = resumed.returncode == 0 and same_params(reference, out)
    summary = json.loads(resumed.stdout.strip().splitlines()[-1]) if resumed.returncode == 0 else {}
    return {
        "fraction": fraction,
        "left": left,
        "resumed_from": summary.get("resumed_from_step"),
        "bitwise": ok,
        "stderr": "" if ok else resumed.stderr[-2000:],
    }
