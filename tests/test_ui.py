"""zoo.ui: the plain step lines a run prints where its progress bar cannot be seen."""

from __future__ import annotations

import json

import pytest

from zoo.cli import main

RUN = ["--steps", "4", "--set", "train.eval_every=2", "--set", "train.log_every=1"]


@pytest.mark.parametrize("recipe", ["digits-mlp", "digits-mlp-dp"])
def test_a_run_off_a_terminal_prints_a_line_every_few_steps_with_only_released_figures(
    capsys, tmp_path, recipe
):
    """stderr captured is not a terminal: the bar shows nothing there until the end, so each of
    the steps gets a line (4 steps: every step). Under DP no line carries the training loss;
    the eval figures and epsilon it shows are those metrics.jsonl holds for that eval."""
    assert main(["train", recipe, "--out", str(tmp_path / "r"), *RUN]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith(f"{recipe}: step ")]
    assert [line.split()[2] for line in lines] == ["1/4", "2/4", "3/4", "4/4"], err
    logged = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    evals = [x for x in logged if "eval_accuracy" in x]
    assert f"eval_accuracy {evals[-1]['eval_accuracy']:.4g}" in lines[-1]
    if recipe.endswith("-dp"):
        assert not any("loss " in line.replace("eval_loss", "") for line in lines), lines
        assert f"epsilon {evals[-1]['epsilon']:.4g}" in lines[-1]
    else:
        losses = [x["loss"] for x in logged if "loss" in x]
        assert f"loss {losses[-1]:.4f}" in lines[-1]


def test_no_progress_prints_no_step_lines(capsys, tmp_path):
    assert main(["train", "digits-mlp", "--out", str(tmp_path / "r"), "--no-progress", *RUN]) == 0
    assert ": step " not in capsys.readouterr().err
