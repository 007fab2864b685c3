"""The run's writer (``zoo.train.tracking``): event files read back with TensorBoard's own reader
hold what ``metrics.jsonl`` holds, under DP only what is released, each step once after a
resume; ``--profile`` writes a trace jax's profile reader opens, and bad windows are refused."""

from __future__ import annotations

import gzip
import json
import shutil

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.e2e.clikit import refused
from tests.numerics import assert_close
from zoo import recipes
from zoo.cli import main
from zoo.commands import settings
from zoo.commands.plot import plot_runs
from zoo.configs import TrainConfig
from zoo.errors import ZooError
from zoo.train.loop import train_recipe
from zoo.train.rundir import load_run
from zoo.train.tracking import parse_profile

TINY = {
    "train.steps": 6,
    "train.log_every": 1,
    "train.eval_every": 3,
    "train.eval_batches": 2,
    "train.checkpoint_every": 3,
}
pytestmark = pytest.mark.filterwarnings("ignore:optim.warmup_steps")
NOT_SCALARS = {"step", "elapsed_sec"}  # the step and wall time are the events' own fields
# What a DP run releases (docs/dp.md): the noisy gradient's norm is post-processing of the noised
# gradient the accountant counts; throughput (over padded rows) and the schedule are public; eval
# metrics and epsilon.
DP_RELEASED = {
    "grad_norm",
    "examples_per_sec",
    "mfu",
    "learning_rate",
    "eval_loss",
    "eval_accuracy",
    "epsilon",
}


def tiny(name: str, **values):
    return settings.with_values(recipes.load_recipe(name), {**TINY, **values})


def read_events(logdir) -> tuple[dict[str, list[tuple[int, float]]], dict[str, str]]:
    """``({tag: [(step, value)]}, {text tag: text})`` read by TensorBoard's EventAccumulator."""
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    scalars = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in tags["scalars"]}
    texts = {tag: acc.Tensors(tag)[-1].tensor_proto.string_val[0].decode() for tag in tags["tensors"]}
    return scalars, texts


def logged(run_dir) -> dict[str, list[tuple[int, float]]]:
    """``{key: [(step, value)]}`` of ``metrics.jsonl``, values as the float32 a scalar event holds;
    a null (a rate before the first timed step, the MFU on a CPU) is no scalar."""
    out: dict[str, list[tuple[int, float]]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        for key, value in record.items():
            if key not in NOT_SCALARS and value is not None:
                out.setdefault(key, []).append((record["step"], float(np.float32(value))))
    return out


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tracking") / "digits"
    train_recipe(tiny("digits-mlp"), out, show_progress=False)
    return out


@pytest.mark.numerics
def test_event_files_hold_the_metrics_tag_for_tag_and_step_for_step(plain_run):
    scalars, texts = read_events(plain_run / "tb")
    assert scalars == logged(plain_run)
    assert {"loss", "eval_loss", "eval_accuracy", "learning_rate", "examples_per_sec"} <= set(scalars)
    # The learning rate, against the schedule written out by hand: warmup from 0 over 20 steps,
    # and step s updates with the schedule at count s - 1.
    lr, warmup = 3e-3, 20
    reference = [lr * (s - 1) / warmup for s in range(1, 7)]  # float64, by hand
    assert_close(
        np.array([v for _, v in scalars["learning_rate"]]), np.array(reference), n=1, dtype=np.float32
    )
    assert texts["recipe"] == f"```toml\n{recipes.to_toml(tiny('digits-mlp'))}```"
    assert "| mlp_hidden" in texts["residuals"] or "| layer_input" in texts["residuals"]


def test_a_dp_run_s_event_files_carry_only_what_is_released(tmp_path):
    out = tmp_path / "dp"
    train_recipe(tiny("digits-mlp-dp", **{"train.steps": 4, "train.eval_every": 2}), out, show_progress=False)
    scalars, texts = read_events(out / "tb")
    assert set(scalars) <= DP_RELEASED, set(scalars) - DP_RELEASED
    assert "epsilon" in scalars and "grad_norm" in scalars
    assert scalars == logged(out)  # and exactly what metrics.jsonl carries
    assert set(texts) == {"recipe", "residuals"}


def test_a_resumed_run_has_each_step_once_in_its_events_and_its_plot(tmp_path):
    out = tmp_path / "resumed"
    recipe = tiny("digits-mlp")
    train_recipe(recipe, out, show_progress=False)
    # Lose the last checkpoint: the resume continues from step 3 and runs steps 4..6 again.
    shutil.rmtree(out / "checkpoints" / "6")
    (out / "summary.json").unlink()
    train_recipe(recipe, out, resume=True, show_progress=False)
    scalars, _ = read_events(out / "tb")
    for tag, points in scalars.items():
        steps = [step for step, _ in points]
        assert steps == sorted(set(steps)), (tag, steps)
    assert scalars == logged(out)
    elapsed = [json.loads(line)["elapsed_sec"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert elapsed == sorted(elapsed)  # one clock over both segments
    drawn = plot_runs([load_run(out)], tmp_path / "resumed.png")
    xs, _ = drawn[(str(out), "loss")]
    assert xs == [1, 2, 3, 4, 5, 6]


def test_tensorboard_false_writes_no_event_files(tmp_path):
    train_recipe(
        tiny("digits-mlp", **{"train.steps": 2, "train.tensorboard": False}), tmp_path, show_progress=False
    )
    assert (tmp_path / "metrics.jsonl").exists()
    assert not (tmp_path / "tb").exists()


def _pprof_strings(data: bytes) -> list[bytes]:
    """The string table (field 6) of a pprof ``Profile`` message, read off the protobuf wire."""

    def varint(i):
        shift = value = 0
        while True:
            byte = data[i]
            value |= (byte & 0x7F) << shift
            i, shift = i + 1, shift + 7
            if byte < 0x80:
                return value, i

    strings, i = [], 0
    while i < len(data):
        key, i = varint(i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, i = varint(i)
        elif wire == 2:
            size, i = varint(i)
            if field == 6:
                strings.append(data[i : i + size])
            i += size
        else:
            raise AssertionError(f"pprof: unexpected wire type {wire} of field {field}")
    return strings


def test_profile_writes_a_trace_the_profile_reader_opens_and_says_where(tmp_path, capsys):
    from jax.profiler import ProfileData

    out = tmp_path / "profiled"
    argv = ["train", "digits-mlp", *(f"--set={k}={v}" for k, v in TINY.items()), "--no-progress", "--json"]
    capsys.readouterr()
    assert main([*argv, "--profile", "3:2", "--out", str(out)]) == 0
    (trace_dir,) = (out / "tb" / "plugins" / "profile").iterdir()
    said = " ".join(capsys.readouterr().err.split())
    assert f"profile of steps 3..4 written under {trace_dir.parent} (in a folder named by the time" in said
    assert f"--logdir {out / 'tb'}" in said
    (xplane,) = trace_dir.glob("*.xplane.pb")
    profile = ProfileData.from_file(str(xplane))
    names = {event.name for plane in profile.planes for line in plane.lines for event in line.events}
    assert any("train_step" in name for name in names), sorted(names)[:20]
    strings = _pprof_strings(gzip.decompress((trace_dir / "memory.prof").read_bytes()))
    assert strings[0] == b"" and {b"space", b"bytes"} <= set(strings)  # pprof: the table starts empty


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("7", "past the run's 6 steps"),
        ("5:3", "past the run's 6 steps"),
        ("abc", "expected STEP or STEP:N"),
        ("3:", "expected STEP or STEP:N"),
        ("1", "step 1 compiles"),
        ("3:0", "N must be at least 1"),
    ],
)
def test_profile_refuses_a_bad_window_in_one_line(capsys, tmp_path, value, fragment):
    argv = ["train", "digits-mlp", "--steps=6", "--no-progress", "--out", str(tmp_path / "r")]
    refused(capsys, [*argv, f"--profile={value}"], fragment, repr(value))
    assert not (tmp_path / "r").exists()  # refused before the run starts


def test_profile_refuses_a_run_of_many_processes():
    with pytest.raises(ValueError, match="this run has 2"):
        parse_profile("3", steps=6, processes=2)


def test_train_tensorboard_takes_only_true_or_false():
    with pytest.raises(ZooError, match="train.tensorboard must be bool, got 'yes'"):  # a recipe or --set
        settings.with_values(recipes.load_recipe("digits-mlp"), {"train.tensorboard": "yes"})
    with pytest.raises(ZooError, match="train.tensorboard must be true or false, got 1"):  # the Python API
        TrainConfig(tensorboard=1)


@pytest.mark.parametrize("schedule,warmup", [("cosine", 2), ("constant", 0), ("constant", 2)])
def test_the_logged_learning_rate_is_the_schedule_at_each_step(schedule, warmup):
    """optax's constant schedule returns one scalar for a vector of counts: each step still
    gets its own rate, equal to the schedule called one count at a time."""
    from types import SimpleNamespace

    from zoo.configs import OptimConfig
    from zoo.train.state import learning_rate
    from zoo.train.tracking import learning_rates

    optim = OptimConfig(schedule=schedule, warmup_steps=warmup, lr=0.01)
    run = SimpleNamespace(recipe=SimpleNamespace(optim=optim), plan_steps=10)
    rates = learning_rates(run, [1, 3, 5, 10])
    one_at_a_time = {s: float(learning_rate(optim, 10)(s - 1)) for s in (1, 3, 5, 10)}
    assert rates.keys() == one_at_a_time.keys()
    assert_close(np.array(list(rates.values())), np.array(list(one_at_a_time.values())), n=1)


@pytest.mark.parametrize("private", [True, False])
def test_a_dp_profile_starts_the_trace_without_the_python_tracer(monkeypatch, tmp_path, private):
    """Issue 60, item 1: under DP the Python tracer recorded the data loader and the accountant
    (tests/e2e/test_dp_users.py compares neighbours' traces); without DP it stays on."""
    import jax

    from zoo.train.tracking import ProfileWindow, _Profiler

    started = []
    monkeypatch.setattr(jax.profiler, "start_trace", lambda logdir, **kw: started.append(kw))
    _Profiler(tmp_path, ProfileWindow(2), private=private).before(2)
    options = started[0].get("profiler_options")
    level = 1 if options is None else options.python_tracer_level
    assert (level == 0) is private
