"""Issue 33, run directories: --out that cannot be written, start points of another task or
with adapters, --resume on an export or a new directory, and Ctrl-C: its printed command works
as printed, and an interrupted checkpoint write finishes without orbax's errors."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import textwrap

import pytest

from benchmarks.train import faultkit
from tests.e2e.clikit import refused
from tests.tiny import TINY_LM
from zoo.cli import main
from zoo.train import checkpoint


# Session scope: one worker of the group trains these once (a few seconds each).
@pytest.fixture(scope="session")
def lm_runs(tmp_path_factory):
    """A one-step LM run, a LoRA run over it, and an export of the LoRA run."""
    root = tmp_path_factory.mktemp("cli-inputs-runs")
    base, adapted, export = root / "lm", root / "lora", root / "export"
    assert main(["train", "python-docs-lm", "--out", str(base), *TINY_LM]) == 0
    lora = ["--init-from", str(base), "--lora", "rank=2,alpha=4,targets=attn.q"]
    assert main(["train", "python-docs-lm", "--out", str(adapted), *TINY_LM, *lora]) == 0
    assert main(["export", str(adapted), "--out", str(export), "--json"]) == 0
    return base, adapted, export


LONG_NAME = "n" * 300


def _out_cases(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    return {
        "under-a-file": (afile / "run", ["is a file, not a directory"]),
        "proc": ("/proc/zoo-run", ["/proc does not take new folders"]),
        "long-name": (tmp_path / LONG_NAME / "run", ["a name of 300 bytes is longer than the"]),
    }


@pytest.mark.parametrize("case", ["under-a-file", "proc", "long-name"])
def test_an_out_that_cannot_be_written_is_one_line(capsys, tmp_path, case):
    out, words = _out_cases(tmp_path)[case]
    refused(capsys, ["train", "digits-mlp", "--out", str(out)], "cannot be written", *words)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # nothing left behind


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_out_is_one_line(capsys, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    refused(capsys, ["train", "digits-mlp", "--out", str(locked / "run")], "is not writable")


@pytest.mark.xdist_group("cli-inputs-runs")
@pytest.mark.parametrize("case", ["under-a-file", "proc", "long-name"])
def test_an_export_out_that_cannot_be_written_is_one_line(capsys, tmp_path, lm_runs, case):
    out, words = _out_cases(tmp_path)[case]
    refused(capsys, ["export", str(lm_runs[1]), "--out", str(out)], "cannot be written", *words)


@pytest.mark.xdist_group("cli-inputs-runs")
def test_init_from_an_lm_run_into_a_classifier_names_the_tasks(capsys, tmp_path, lm_runs):
    line = refused(
        capsys,
        ["train", "digits-mlp", "--init-from", str(lm_runs[0]), "--out", str(tmp_path / "r")],
        "holds a 'lm' model",
        "trains a 'classify' model",
    )
    assert "tokenizer=" not in line


@pytest.mark.xdist_group("cli-inputs-runs")
def test_init_from_a_lora_run_points_to_export_merge(capsys, tmp_path, lm_runs):
    argv = ["train", "python-docs-lm", "--init-from", str(lm_runs[1]), "--out", str(tmp_path / "r"), *TINY_LM]
    line = refused(capsys, argv, "is a LoRA run", f"zoo export {lm_runs[1]} --merge --out DIR")
    assert "lora_a" not in line


@pytest.mark.xdist_group("cli-inputs-runs")
def test_resume_on_an_export_says_it_has_no_training_state(capsys, lm_runs):
    argv = ["train", "python-docs-lm", "--resume", "--out", str(lm_runs[2]), *TINY_LM]
    line = refused(capsys, argv, "is an export", "no training state to resume", "--init-from")
    assert "->" not in line  # not a list of recipe differences


@pytest.mark.parametrize("form", [[], ["--format", "hf"]], ids=["zoo", "hf"])
@pytest.mark.parametrize("made", [False, True], ids=["missing", "empty"])
def test_an_export_of_no_run_names_import_as_well_as_train(capsys, tmp_path, form, made):
    run = tmp_path / "gpt2"
    if made:
        run.mkdir()
    argv = ["export", str(run), "--out", str(tmp_path / "hf"), *form]
    refused(capsys, argv, repr(str(run)), f"zoo import ORG/NAME --out {run}", f"zoo train RECIPE --out {run}")


def test_resume_into_a_new_directory_says_it_starts_fresh(capsys, tmp_path):
    out = tmp_path / "new"
    assert main(["train", "digits-mlp", "--resume", "--out", str(out), "--steps", "1", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert f"--resume: {out} does not exist yet; starting a new run there at step 0" in err
    assert "Traceback" not in err


# --- Ctrl-C -----------------------------------------------------------------------------------

FLAGS = ["--steps", "20", "--set", "train.checkpoint_every=10", "--set", "train.log_every=5"]


@pytest.mark.xdist_group("cli-inputs-subprocess")
def test_the_continue_command_after_ctrl_c_keeps_the_flags_and_works_as_printed(tmp_path, capsys):
    out = tmp_path / "run"
    flags = ["digits-mlp", *FLAGS, "--set", "optim.lr=0.01", "--no-progress", "--out", str(out)]
    interrupted = faultkit.victim("sigint-log", 15, 0.0, *flags)
    assert interrupted.returncode == 130 and "Traceback" not in interrupted.stderr, interrupted.stderr
    line = next(x for x in interrupted.stderr.splitlines() if "Continue with: " in x)
    command = shlex.split(line.split("Continue with: ", 1)[1])
    assert command[:3] == ["zoo", "train", "digits-mlp"] and "--resume" in command
    assert "--steps 20" in shlex.join(command) and "optim.lr=0.01" in command
    assert main(command[1:]) == 0
    assert checkpoint.latest_step(out) == 20


_SAVE_VICTIM = textwrap.dedent(
    """
    import os, signal, sys
    import orbax.checkpoint as ocp
    from zoo.cli import main

    signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal
    save = ocp.CheckpointManager.save

    def interrupted_save(self, step, *args, **kwargs):  # Ctrl-C as orbax starts writing
        if step == 10:
            os.kill(os.getpid(), signal.SIGINT)
        return save(self, step, *args, **kwargs)

    ocp.CheckpointManager.save = interrupted_save
    sys.exit(main(["train", *sys.argv[1:]]))
    """
)


@pytest.mark.xdist_group("cli-inputs-subprocess")
def test_ctrl_c_during_a_checkpoint_write_finishes_the_write_quietly(tmp_path):
    out = tmp_path / "run"
    argv = ["digits-mlp", *FLAGS, "--no-progress", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, "-c", _SAVE_VICTIM, *argv], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr and "RuntimeError" not in done.stderr, done.stderr
    assert "the last checkpoint is step 10" in done.stderr
    assert checkpoint.latest_step(out) == 10 and checkpoint.step_problem(out, 10) is None
