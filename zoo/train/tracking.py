"""What a run shows while it trains: one writer the loop calls, behind which sit
``metrics.jsonl``, TensorBoard event files (``RUN/tb/``) and ``jax.profiler`` traces.

The loop hands :meth:`Tracker.write` the records it logs; the tracker adds what follows from
them and the recipe alone (the learning rate of the step, tokens per second of a language
model, the seconds since the run started) and writes the same record to every sink. So the
event files carry exactly what ``metrics.jsonl`` carries: under DP no training loss, only
what the loop releases (clf. ``clu.metric_writers``, Levanter's tracker).

On a resumed run the metrics log drops the lines past the checkpoint, and the event files are
written again from the lines kept, so that each step appears once in both.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

from zoo.errors import ZooError
from zoo.recipes import to_toml
from zoo.train import runlog
from zoo.train.rundir import ELAPSED, read_records

TB_DIR = "tb"
PROFILE_DIR = "plugins/profile"  # where jax.profiler.start_trace(RUN/tb) writes its trace
MEMORY_PROFILE = "memory.prof"
NOT_SCALARS = ("step", ELAPSED)  # the event files carry the step and the wall time of their own


@dataclass(frozen=True)
class ProfileWindow:
    """Steps ``first .. first + count - 1`` (numbered as in ``metrics.jsonl``: step 1 is the
    first) to trace with ``jax.profiler``."""

    first: int
    count: int = 1

    @property
    def last(self) -> int:
        return self.first + self.count - 1


def parse_profile(text: str, steps: int, processes: int = 1) -> ProfileWindow:
    """``STEP[:N]`` as a :class:`ProfileWindow` inside a run of ``steps`` steps, or ValueError.
    Step 1 compiles the training step, so a trace of the steady state starts at step 2. A run
    of many processes is refused: each would trace only its own devices into one folder."""
    if processes > 1:
        raise ValueError(f"--profile traces one process; this run has {processes}. Profile a one-process run")
    match = re.fullmatch(r"\s*(\d+)\s*(?::\s*(\d+)\s*)?", text)
    if not match:
        raise ValueError(f"--profile {text!r}: expected STEP or STEP:N with whole numbers, e.g. 100:5")
    window = ProfileWindow(int(match.group(1)), int(match.group(2) or 1))
    if window.count < 1:
        raise ValueError(f"--profile {text!r}: N must be at least 1")
    if window.first < 2:
        raise ValueError(f"--profile {text!r}: STEP must be at least 2 (step 1 compiles the training step)")
    if window.last > steps:
        raise ValueError(
            f"--profile {text!r}: the trace would end at step {window.last}, past the run's "
            f"{steps} steps; choose STEP:N with STEP + N - 1 <= {steps}"
        )
    return window


def learning_rates(run, steps) -> dict[int, float]:
    """The learning rate each of ``steps`` (counted from 1) used: the schedule at the optimizer's
    count before that update. One vectorised call, so the loop never dispatches a schedule."""
    import numpy as np

    from zoo.train.state import learning_rate

    steps = np.asarray(sorted(set(steps)), dtype=np.int64)
    rates = np.asarray(learning_rate(run.recipe.optim, run.plan_steps)(steps - 1), dtype=np.float64)
    rates = np.broadcast_to(rates, steps.shape)  # optax's constant schedule gives one scalar
    return dict(zip(steps.tolist(), rates.tolist(), strict=True))


def _logged_steps(run, start: int) -> list[int]:
    every = run.recipe.train.log_every
    return [*range((start // every + 1) * every, run.steps + 1, every), run.steps]


class Tracker:
    """The run's writers, fed one record at a time by the loop (process 0 only)."""

    def __init__(self, run, out: Path, start: int, profile: ProfileWindow | None = None) -> None:
        self._run, self._out = run, out
        self._log = runlog.MetricsLog(out / runlog.METRICS, start)
        self._rates = learning_rates(run, _logged_steps(run, start))
        kept = read_records(out) if start else []
        offset = max((r.get(ELAPSED, 0.0) for r in kept), default=0.0)
        # Elapsed seconds on one clock over every segment of a resumed run; the event files'
        # wall times are that clock placed at the run's (resume-gap free) start.
        self._clock0, self._wall0 = time.monotonic() - offset, time.time() - offset
        self._events = None
        if run.recipe.train.tensorboard:
            from zoo.train.events import EventWriter

            self._events = EventWriter(out / TB_DIR)
            for record in kept:
                self._scalars(record)
            self._events.text("recipe", f"```toml\n{to_toml(run.recipe)}```", step=start)
            table = residual_table(run)
            if table:
                self._events.text("residuals", table, step=start)
        self._profiler = _Profiler(out / TB_DIR, profile, private=run.dp is not None) if profile else None

    def write(self, record: dict) -> None:
        """Log ``record`` (``{"step": N, metric: value, ...}``) to every sink."""
        record = {**record, **self._derived(record), ELAPSED: round(time.monotonic() - self._clock0, 3)}
        self._log.write(record)
        if self._events is not None:
            self._scalars(record)

    def _scalars(self, record: dict) -> None:
        self._events.scalars(record, skip=NOT_SCALARS, wall_time=self._wall0 + record.get(ELAPSED, 0.0))

    def _derived(self, record: dict) -> dict:
        if "examples_per_sec" not in record:  # an eval record
            return {}
        step = record["step"]
        rate = self._rates.get(step)
        if rate is None:  # not on the cadence (never, as the loop logs)
            rate = learning_rates(self._run, [step])[step]
        return {"learning_rate": rate}

    def before_step(self, step: int) -> None:
        """Called before the step with index ``step`` (0-based) runs."""
        if self._profiler:
            self._profiler.before(step + 1)

    def after_step(self, step: int, state) -> None:
        """Called once the step with index ``step`` returned ``state``."""
        if self._profiler:
            self._profiler.after(step + 1, state)

    @property
    def trace(self) -> Path | None:
        """The folder the profile window's trace was written to, once it has been."""
        return self._profiler.written if self._profiler else None

    def close(self) -> None:
        try:
            if self._profiler:
                self._profiler.stop()
        finally:
            self._log.close()
            if self._events is not None:
                self._events.close()


class NullTracker(Tracker):
    """The tracker of a process that writes nothing (all but process 0)."""

    def __init__(self) -> None:
        self._profiler = None

    def write(self, record: dict) -> None:
        pass

    def close(self) -> None:
        pass


def open_tracker(run, out: Path, start: int, main: bool, profile: ProfileWindow | None = None) -> Tracker:
    """The tracker the loop writes to; refuses a profile window the run cannot trace."""
    if profile is not None:
        import jax

        parse_profile(f"{profile.first}:{profile.count}", run.steps, jax.process_count())
        if profile.first < start + 2 or profile.last > run.steps:
            raise ZooError(
                f"--profile {profile.first}:{profile.count} does not fit steps {start + 2}..{run.steps} "
                f"of this run (it resumes at step {start}, whose next step compiles)"
            )
    return Tracker(run, out, start, profile) if main else NullTracker()


def residual_table(run) -> str | None:
    """The residual bytes of the run's remat policy at its batch shape, as a markdown table,
    traced on shapes only (nothing runs); None where the inspector cannot trace the model."""
    from zoo.residuals import residual_report
    from zoo.ui import human_bytes

    policy = run.remat.removeprefix("auto:")
    try:
        report = residual_report(
            run.cfg,
            policy,
            backend=run.engine.backend,
            batch=run.batch_rows,
            seq=run.task.seq_len if run.task.type.tokenized else None,
            precision=run.precision,
        )
    except (ValueError, TypeError, ZooError) as error:
        return f"the residual inspector could not trace this model: {error}"
    rows = [r for r in report["residuals"] if r["kind"] in ("activation", "constant")]
    lines = [
        f"Residuals the backward pass keeps under `{policy}` at batch {run.batch_rows} (the whole "
        f"model, as `zoo residuals` traces it: {human_bytes(report['total_device_bytes'])} on the "
        f"device, {human_bytes(report['total_host_bytes'])} on the host)",
        "",
        "| name | scope | shape | dtype | memory | count | bytes |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        shape = "[" + ",".join(map(str, r["shape"])) + "]"
        lines.append(
            f"| {r['name']} | {r['scope']} | {shape} | {r['dtype']} | {r['memory_kind']} "
            f"| {r['count']} | {human_bytes(r['bytes'])} |"
        )
    return "\n".join(lines)


class _Profiler:
    """A ``jax.profiler`` trace of a window of steps, then the device memory profile beside it.

    Under DP (``private``) the trace holds no Python events: the Python tracer would record the
    data loader (a user's records are sorted only when it holds more than ``k``) and the
    accountant of an eval step (millions of events), each a function of the records. What stays
    is the compiled step and the runtime's own events, the same for neighbouring datasets."""

    def __init__(self, logdir: Path, window: ProfileWindow, private: bool = False) -> None:
        self._logdir, self._window, self._active = logdir, window, False
        self.written: Path | None = None
        self._private = private

    def before(self, step: int) -> None:
        if step == self._window.first:
            import jax

            self._logdir.mkdir(parents=True, exist_ok=True)
            options = None
            if self._private:
                options = jax.profiler.ProfileOptions()
                options.python_tracer_level = 0  # no Python events: the loader's, the accountant's
            jax.profiler.start_trace(str(self._logdir), profiler_options=options)
            self._active = True

    def after(self, step: int, state) -> None:
        if step == self._window.last and self._active:
            import jax

            jax.block_until_ready(state)
            self.stop()

    def stop(self) -> None:
        if not self._active:
            return
        import jax

        self._active = False
        jax.profiler.stop_trace()
        traces = sorted((self._logdir / PROFILE_DIR).iterdir(), key=lambda p: p.stat().st_mtime)
        jax.profiler.save_device_memory_profile(str(traces[-1] / MEMORY_PROFILE))
        self.written = traces[-1]
