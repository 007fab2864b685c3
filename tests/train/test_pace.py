"""zoo.train.pace: the rate a run reports is its steady state (the compiling first step and the
eval and checkpoint pauses left out, and reported apart), its MFU is the step's FLOPs against
the devices' peak (none on a CPU), and the loop's summary, metrics lines and step lines carry
them. The loop runs on a fake clock that only the step, the evaluation and the checkpoint
writes move, on a stubbed accelerator."""

from __future__ import annotations

import io
import json
import types

import pytest
from rich.console import Console

from zoo import recipes
from zoo.commands import settings
from zoo.train import checkpoint, loop, pace, throughput
from zoo.train.loop import train_recipe
from zoo.train.pace import Pace, StepCounts

# One xdist group: the module-scoped accelerator run is trained once, not once per worker.
pytestmark = [pytest.mark.filterwarnings("ignore:optim.warmup_steps"), pytest.mark.xdist_group("pace")]


class FakeClock:
    """Seconds that pass only when a test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_the_rate_leaves_out_the_first_step_and_the_pauses_and_reports_them():
    clock = FakeClock()
    meter = Pace(StepCounts(rows=8, tokens_per_row=32, flops=1e9, peak=1e12, peak_source="table"), clock)
    clock.advance(10.0)  # the first step: compiling
    meter.step_done(8)
    assert (meter.examples_per_sec, meter.mfu, meter.text()) == (None, None, "-")
    for _ in range(2):
        clock.advance(1.0)
        meter.step_done(8)
    with meter.pause("eval"):
        clock.advance(3.0)
    clock.advance(1.0)
    meter.step_done(8)
    with meter.pause("checkpoint"):
        clock.advance(2.0)
    clock.advance(1.0)
    meter.step_done(8)
    # four steps of a second each, after the first
    assert (meter.examples_per_sec, meter.tokens_per_sec) == (8.0, 256.0)
    assert meter.mfu == 1e9 / 1.0 / 1e12
    assert meter.text() == "256 tok/s, MFU 0.1%"
    assert meter.record() == {"examples_per_sec": 8.0, "tokens_per_sec": 256.0, "mfu": 1e-3}
    clock.advance(0.5)  # after the last step (the summary's eval): in the wall time only
    summary = meter.summary()
    assert summary == {
        "tokens_per_sec": 256.0,
        "mfu": 1e-3,
        "step_flops": 1e9,
        "peak_flops": 1e12,
        "peak_source": "table",
        "timed_steps": 4,
        "train_sec": 4.0,
        "startup_sec": 10.0,
        "eval_sec": 3.0,
        "checkpoint_sec": 2.0,
        "wall_sec": 19.5,
    }


def test_a_classifier_on_a_cpu_shows_examples_a_second_and_no_mfu():
    clock = FakeClock()
    meter = Pace(StepCounts(rows=32, flops=1e6), clock)  # no peak: a CPU
    for seconds in (5.0, 0.25, 0.25):
        clock.advance(seconds)
        meter.step_done(32)
    assert meter.text() == "128 ex/s" and meter.mfu is None
    assert meter.record() == {"examples_per_sec": 128.0, "mfu": None}
    assert "tokens_per_sec" not in meter.summary() and meter.summary()["peak_flops"] is None


TINY_LM = {
    "model.num_layers": 2,
    "model.d_model": 32,
    "model.d_ff": 64,
    "model.max_len": 32,
    "data.seq_len": 32,
    "train.batch_size": 4,
    "train.steps": 6,
    "train.log_every": 1,
    "train.eval_every": 3,
    "train.eval_batches": 1,
    "train.checkpoint_every": 3,
    "freeze.patterns": ["embed", "pos", "blocks[0:1]"],
}
STEP, COMPILE, EVAL, SAVE = 0.5, 10.0, 3.0, 2.0  # fake seconds
V5E = throughput.Chip("TPU v5 lite", 197e12, 98.5e12, 820e9, None, "get_tpu_info")


def tiny_lm():
    return settings.with_values(recipes.load_recipe("python-docs-lm"), TINY_LM)


@pytest.fixture(scope="module")
def accelerator_run(tmp_path_factory):
    """A tiny LM trained on a stubbed TPU v5e whose clock moves only in the step (10 s the first,
    the compile; 0.5 s after), the evaluation (3 s) and the checkpoint writes (2 s)."""
    out = tmp_path_factory.mktemp("pace") / "lm"
    clock, built = FakeClock(), {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pace, "time", types.SimpleNamespace(perf_counter=clock))
        patch.setattr(throughput, "chip", lambda device=None: V5E)
        patch.setattr(loop, "run_evaluation", advancing(loop.run_evaluation, clock, lambda: EVAL))
        patch.setattr(checkpoint, "save", advancing(checkpoint.save, clock, lambda: SAVE))

        def on_built(run):
            seconds = iter([COMPILE, *[STEP] * run.steps])
            run.engine.__dict__["train_step"] = advancing(run.engine.train_step, clock, lambda: next(seconds))
            built["run"] = run

        console = Console(file=io.StringIO(), width=200)  # not a terminal: the step lines
        summary = train_recipe(tiny_lm(), out, console=console, on_built=on_built)
    return summary, out, built["run"], console.file.getvalue()


def advancing(fn, clock: FakeClock, seconds):
    def call(*args, **kwargs):
        result = fn(*args, **kwargs)
        clock.advance(seconds())
        return result

    return call


def test_the_summary_reports_the_steady_rate_the_mfu_and_the_pauses(accelerator_run):
    summary, _, run, _ = accelerator_run
    rows, seq = 4, 32
    flops = throughput.step_flops(run.cfg, rows, seq, run.freeze)
    assert flops < throughput.step_flops(run.cfg, rows, seq)  # a frozen layer needs less backward
    timed = 5  # steps 2..6
    assert (summary["timed_steps"], summary["train_sec"]) == (timed, timed * STEP)
    assert summary["examples_per_sec"] == rows * timed / (timed * STEP)
    assert summary["tokens_per_sec"] == rows * seq * timed / (timed * STEP)
    assert summary["step_flops"] == flops
    assert (summary["peak_flops"], summary["peak_source"]) == (98.5e12, "get_tpu_info")  # float32 compute
    assert summary["mfu"] == flops * timed / (timed * STEP) / 98.5e12
    assert (summary["startup_sec"], summary["eval_sec"], summary["checkpoint_sec"]) == (
        COMPILE,
        2 * EVAL,
        2 * SAVE,
    )
    assert summary["wall_sec"] == COMPILE + timed * STEP + 2 * EVAL + 2 * SAVE


def test_the_metrics_lines_carry_the_rate_and_mfu_from_the_second_step(accelerator_run):
    summary, out, _, _ = accelerator_run
    train = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3, 4, 5, 6]
    assert (train[0]["tokens_per_sec"], train[0]["mfu"]) == (None, None)  # only the compile so far
    assert all(r["tokens_per_sec"] == 4 * 32 / STEP for r in train[1:])
    assert train[-1]["mfu"] == summary["mfu"] and all(r["mfu"] > 0 for r in train[1:])


def test_the_step_lines_show_tokens_a_second_and_the_mfu(accelerator_run):
    summary, _, _, printed = accelerator_run
    shown = f"{4 * 32 / STEP:,.0f} tok/s, MFU {summary['mfu']:.1%}"
    assert f"python-docs-lm: step 6/6  {shown}, loss" in printed


def test_on_this_cpu_an_lm_run_reports_tokens_a_second_and_no_mfu(tmp_path):
    summary = train_recipe(tiny_lm(), tmp_path, show_progress=False)
    assert summary["tokens_per_sec"] == summary["examples_per_sec"] * 32 > 0
    assert (summary["mfu"], summary["peak_flops"], summary["peak_source"]) == (None, None, None)
    assert summary["eval_sec"] > 0 and summary["checkpoint_sec"] > 0
    parts = summary["startup_sec"] + summary["train_sec"] + summary["eval_sec"] + summary["checkpoint_sec"]
    assert summary["wall_sec"] >= parts
    last = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-2])  # the last train line
    assert last["tokens_per_sec"] == summary["tokens_per_sec"] and last["mfu"] is None
