"""The training loop: the only place with clocks, files, progress bars and printing.

:func:`train` runs a built :class:`~zoo.train.run.Run`, writing ``metrics.jsonl``,
``recipe.json`` and orbax checkpoints, or continues it from a resume point.
:func:`train_recipe` is the whole way from a recipe: the run directory is locked
(:mod:`zoo.train.runlock`, one run at a time) and checked (:func:`open_run_dir`), then the run
is built once and trained.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from zoo import lora
from zoo.errors import ZooError
from zoo.parallel.distributed import is_main_process
from zoo.recipes import Recipe, to_dict
from zoo.train import checkpoint, runlock, runlog, tracking
from zoo.train.compiles import CompileCounter
from zoo.train.pace import Pace, step_counts
from zoo.train.prefetch import Prefetch
from zoo.train.resume import (
    ResumePoint,
    check_same_data,
    check_same_root,
    check_store_unchanged,
    dataset_digest,
    fingerprint,
    finished_summary,
    preflight,
    saved_root,
)
from zoo.train.run import Run, build_run, epsilon_at, local_batch, release_params, state_key
from zoo.train.save_guard import RunWriteError
from zoo.train.state import TrainState, key_bytes
from zoo.train.summary import last_logged_loss, run_evaluation, say_resumed, summarize
from zoo.ui import StepLines


class TrainingDiverged(ZooError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


def _meta(run: Run, state: TrainState) -> dict:
    tokenizer = run.task.data.tokenizer
    key = key_bytes(state.rng) if run.dp else None  # under DP, a digest only the run can make
    return {
        "recipe": to_dict(run.recipe),
        "fingerprint": fingerprint(run.recipe),
        "plan_steps": run.plan_steps,
        "data_digest": dataset_digest(run.task.data, key),
        "model": checkpoint.model_meta(run.cfg, run.engine.backend),
        "tokenizer": tokenizer.to_json() if tokenizer else None,
        **({checkpoint.LORA_BASE: run.base} if run.base else {}),
    }


def _say(console: Console, text: str) -> None:
    console.print(text, markup=False, highlight=False, soft_wrap=True)  # commands stay whole


def _quiet_unless_main(console: Console | None, show_progress: bool) -> tuple[Console, bool]:
    """On many processes, process 0 alone prints and writes run files."""
    if not is_main_process():
        return Console(file=io.StringIO()), False
    return console or Console(stderr=True), show_progress


def open_run_dir(
    out: Path, recipe: Recipe, resume: bool, console: Console, existed: bool | None = None
) -> tuple[ResumePoint | None, dict | None]:
    """``(resume point or None, summary of a finished run or None)``, checked before anything
    is built: a refused ``--resume`` or a bad ``--out`` fails here, before the data loads.
    ``existed``: whether ``out`` was there before its lock made it (default: whether it is)."""
    point = preflight(out, recipe, resume)
    if resume and point is None:  # --resume on a new --out: a fresh run, said so
        existed = os.path.exists(out) if existed is None else existed
        there = "holds no checkpoint yet" if existed else "does not exist yet"
        _say(console, f"--resume: {out} {there}; starting a new run there at step 0")
    summary = finished_summary(out, point, recipe)
    if summary is not None:
        _say(console, f"{out} already finished at step {point.step}; nothing to do")
    return point, summary


def train_recipe(
    recipe: Recipe,
    out_dir: str | Path,
    *,
    resume: bool = False,
    console: Console | None = None,
    show_progress: bool = True,
    on_built: Callable[[Run], None] | None = None,
    resume_command: str | None = None,
    profile: tracking.ProfileWindow | None = None,
) -> dict:
    """Train ``recipe`` into ``out_dir`` and return the run summary.

    With ``resume``, the run continues from the newest intact checkpoint if
    ``zoo.train.resume`` allows it, and a finished run is left exactly as it was.
    ``on_built`` sees the run once it is built, before the first step (the CLI prints its
    parameter table). ``resume_command`` is printed on Ctrl-C as the command that continues.
    """
    console, show_progress = _quiet_unless_main(console, show_progress)
    out = Path(out_dir)
    existed = os.path.exists(out)  # False, not raised, for a name too long
    # One run at a time in ``out``, from its checks to its summary: process 0 holds the lock.
    with runlock.hold(out) if is_main_process() else contextlib.nullcontext():
        point, finished = open_run_dir(out, recipe, resume, console, existed)
        if finished is not None:
            return finished
        root = saved_root(out, point)
        run = build_run(recipe, point.plan_steps if point else None, console=console, root=root)
        if recipe.model.init_from:  # zoo has no loss scaling for float16
            from zoo.train import checks

            checks.check_trainable_dtype(recipe.model.init_from, run.params)
        if on_built is not None:
            on_built(run)
        return train(
            run,
            out,
            point=point,
            console=console,
            show_progress=show_progress,
            resume_command=resume_command,
            profile=profile,
        )


def _restore(run: Run, out: Path, point: ResumePoint | None, console: Console):
    """``(state, frozen, start step, checkpoint metadata)``: fresh, or the resume point's."""
    engine, seed = run.engine, run.recipe.train.seed
    state, frozen = engine.init_state(run.params, seed, state_key(run))
    release_params(run)  # the state holds its own copy: the initial weights need not stay resident
    if not point:
        return state, frozen, 0, _meta(run, state)
    check_same_data(point.meta, _meta(run, state), str(out), arrays=False)  # the state fits
    state = engine.place_state(checkpoint.restore_state(out, point.step, state))  # offloaded: to host
    check_same_root(run.root, state.rng)  # the plan's sampler was seeded from the same key
    meta = _meta(run, state)  # under DP the digest is keyed with the run's own (restored) key
    check_same_data(point.meta, meta, str(out))
    check_store_unchanged(run.task.data, str(out))
    checkpoint.quarantine_after(out, point.step)
    # Frozen weights come from the run's own checkpoint, not again from the start checkpoint,
    # whose newest step may have moved on since.
    frozen = engine.place_frozen(run.freeze.split(checkpoint.restore_params(out, point.step))[1])
    say_resumed(console, out, point, run)
    return state, frozen, point.step, meta


@dataclass
class _Progress:
    """What the loop has done so far (mutable: the loop's own bookkeeping)."""

    start: int
    done: int
    last_saved: int
    pace: Pace  # the steady-state rate, and the seconds of eval and checkpoints
    loss: float = float("nan")
    eval_metrics: dict | None = None


def train(
    run: Run,
    out_dir: str | Path,
    *,
    point: ResumePoint | None = None,
    console: Console | None = None,
    show_progress: bool = True,
    resume_command: str | None = None,
    profile: tracking.ProfileWindow | None = None,
) -> dict:
    """Train ``run`` into ``out_dir`` (from ``point``, a checkpoint :func:`open_run_dir`
    accepted, if given) and return the run summary. On Ctrl-C, says where it stopped and
    ``resume_command`` (the command that continues the run, as the CLI knows it); a checkpoint
    or a metrics line written out of room is one ZooError line saying the same."""
    if point is not None and point.plan_steps != run.plan_steps:
        raise ValueError(
            f"the run was built for {run.plan_steps} planned steps, its checkpoint for "
            f"{point.plan_steps}: build it with build_run(recipe, point.plan_steps)"
        )
    console, show_progress = _quiet_unless_main(console, show_progress)
    main = is_main_process()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pace = Pace(step_counts(run))  # the run's wall time starts here
    state, frozen, start, meta = _restore(run, out, point, console)
    if run.task.data.notice:  # e.g. text: is tokenized in memory; said once the run is accepted
        _say(console, run.task.data.notice)
    if main and (not point or point.changes):
        runlog.write_json(out / runlog.RECIPE, meta["recipe"])
    log = tracking.open_tracker(run, out, start, main, profile)  # metrics.jsonl, tb/, the profiler
    progress = _Progress(start=start, done=start, last_saved=start, pace=pace)
    try:
        with CompileCounter() as compiles:
            state = _steps(run, out, state, frozen, meta, log, progress, console, show_progress, compiles)
    except KeyboardInterrupt:
        _say(
            console,
            f"interrupted after step {progress.done}; {_how_to_continue(progress, out, resume_command)}",
        )
        raise
    except RunWriteError as error:  # a full disk: the last good checkpoint is intact
        raise ZooError(
            f"{error}; {_how_to_continue(progress, out, resume_command, 'Once there is room, continue')}"
        ) from None
    finally:
        log.close()
    if log.trace is not None:
        _say(
            console,
            # the trace's own folder is named by the clock: the line names its parent, so that two
            # runs print the same text (under DP the printed text is compared between neighbours)
            f"profile of steps {profile.first}..{profile.last} written under {log.trace.parent} (in a folder "
            f"named by the time, {tracking.MEMORY_PROFILE} beside the trace): tensorboard --logdir "
            f"{out / tracking.TB_DIR}, the Profile tab",
        )
    if start == run.steps:  # finished, but killed before its summary was written
        with pace.pause("eval"):
            progress.eval_metrics = run_evaluation(run, state, frozen)
        progress.loss = last_logged_loss(out)
    summary = summarize(
        run, out, progress.loss, progress.eval_metrics or {}, compiles.count, pace.examples_per_sec, point,
        speed=pace.summary(),
    )  # fmt: skip
    if main:
        try:
            runlog.write_json(out / runlog.SUMMARY, summary)
        except RunWriteError as error:  # the steps are done and saved: a resume writes only this
            raise ZooError(
                f"{error}; {_how_to_continue(progress, out, resume_command, 'Once there is room, write it')}"
            ) from None
    return summary


def _how_to_continue(
    progress: _Progress, out: Path, resume_command: str | None, lead: str = "Continue"
) -> str:
    """Where a stopped run's last checkpoint is, and the command that continues it."""
    saved = progress.last_saved
    where = f"the last checkpoint is step {saved}" if saved else "no checkpoint was written yet"
    how = (
        f"with: {resume_command}"
        if resume_command
        else f"with the same recipe and settings, and --resume --out {out}"
    )
    return f"{where} in {out}. {lead} {how}"


def _steps(run, out, state, frozen, meta, log, progress, console, show_progress, compiles) -> TrainState:
    """Steps ``progress.start .. run.steps``: log, evaluate and checkpoint on the cadence."""
    engine, cadence, steps = run.engine, run.recipe.train, run.steps
    rows = engine.layout.local_rows(run.batch_rows)  # this process reads only its rows
    prefetch = Prefetch(lambda step: local_batch(run, step, rows), range(progress.start, steps))
    pace = progress.pace
    with runlog.progress_bar(console, rate_unit=None) as bar_view, prefetch:
        bar = bar_view.add_task(
            run.recipe.name, total=steps, completed=progress.start, loss="-", rate="-", visible=show_progress
        )
        lines = StepLines(console, run.recipe.name, steps, visible=show_progress)  # off a terminal
        for step, (batch, examples) in prefetch:
            log.before_step(step)
            with compiles.track():
                state, metrics = engine.train_step(
                    state, frozen, engine.layout.place_local(batch, run.batch_rows)
                )
            log.after_step(step, state)  # a profile window ends here
            # Under DP the batch's loss (no noise) is not released; the noisy gradient's norm is.
            loss = None if run.dp else float(metrics["loss"])
            grad_norm = float(metrics["grad_norm"])
            # the first step compiles and is not timed; under DP every padded row counts (the
            # realised batch size is not released)
            pace.step_done(run.batch_rows if run.dp else examples)
            watched = (loss, "loss") if loss is not None else (grad_norm, "the noisy gradient's norm")
            if not math.isfinite(watched[0]):
                _diverged(*watched, step, progress.last_saved, out)
            done = progress.done = step + 1
            progress.loss = float("nan") if loss is None else loss
            shown = "-" if loss is None else f"{loss:.4f}"
            bar_view.update(bar, completed=done, loss=shown, rate=pace.text())
            if done % cadence.log_every == 0 or done == steps:
                losses = {} if loss is None else {"loss": loss}
                log.write({"step": done, **losses, "grad_norm": grad_norm, **pace.record()})
            if done % cadence.eval_every == 0 or done == steps:
                with pace.pause("eval"):
                    progress.eval_metrics = run_evaluation(run, state, frozen)
                if run.dp:
                    progress.eval_metrics["epsilon"] = epsilon_at(run, done)
                log.write({"step": done, **progress.eval_metrics})
            if done % cadence.checkpoint_every == 0 or done == steps:
                params = run.freeze.merge(state.params, frozen)
                with checkpoint.finish_before_interrupt(), pace.pause("checkpoint"):  # Ctrl-C waits
                    checkpoint.save(out, done, state, lora.adapters_of(params) if run.base else params, meta)
                    progress.last_saved = done
            lines.update(done, speed=pace.text(), loss=loss, evals=progress.eval_metrics)
    return state


def _diverged(value: float, what: str, step: int, last_saved: int, out: Path):
    raise TrainingDiverged(
        f"{what} became {value} at step {step + 1}; stopped. The last good checkpoint "
        f"is step {last_saved} in {str(out)!r}"
        if last_saved
        else f"{what} became {value} at step {step + 1}; stopped before any checkpoint"
    )
