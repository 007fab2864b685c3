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


class _Clock:
    """A clock that moves ``tick`` seconds at each reading: each timed step takes ``tick``."""

    def __init__(self, tick: float):
        self.now, self.tick = 0.0, tick

    def perf_counter(self) -> float:
        self.now += self.tick
        return self.now


def test_a_slow_run_shows_its_rate_with_its_digits_not_zero(capsys, tmp_path, monkeypatch):
    """Issue 67, item 16: at under one example a second the lines and the bar read "0 ex/s".
    A fake clock makes each step take 10 s: 4 examples a step is 0.4 ex/s, and the first step,
    which compiles and is not timed, has no rate yet."""
    from zoo.train import pace

    monkeypatch.setattr(pace, "time", _Clock(10.0))
    # One eval, after the last step: every clock reading between the first step's end and the
    # last is a step's end, so each timed step takes the clock's 10 s.
    run = [*RUN, "--set", "train.eval_every=4"]
    assert main(["train", "digits-mlp", "--out", str(tmp_path / "r"), "--batch-size", "4", *run]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("digits-mlp: step ")]
    assert [line.split("  ")[1].split(",")[0] for line in lines] == ["-", *["0.4 ex/s"] * 3], err
    bar = [line for line in err.splitlines() if line.startswith("digits-mlp ")]
    assert bar and "0.4 ex/s" in bar[-1], err


@pytest.mark.parametrize(
    "rate, shown", [(None, "-"), (0.0, "-"), (0.4234, "0.423"), (42.34, "42.3"), (1234.5, "1,234")]
)
def test_a_rate_keeps_three_significant_figures_below_100(rate, shown):
    from zoo.ui import rate_text

    assert rate_text(rate) == shown


def test_the_stdout_console_writes_past_a_live_displays_proxy_once(capsys):
    """A progress bar on a terminal puts rich's proxy on ``sys.stdout``, which prints a held
    partial line through the stdout console when flushed: the console writes to the proxied
    stream, as rich's own console does (writing through the proxy recursed without end)."""
    import sys

    from rich.file_proxy import FileProxy

    from zoo.ui import console

    real = sys.stdout
    sys.stdout = FileProxy(console, real)
    try:
        sys.stdout.write("a partial line, held by the proxy")
        console.print("a line of the console")
    finally:
        sys.stdout = real
    # the held line comes out once, after (as with rich's own stdout console)
    assert capsys.readouterr().out == "a line of the console\na partial line, held by the proxy\n"
