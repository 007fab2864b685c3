"""What a run reports: eval metrics per task, the resume notice and ``summary.json``."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import jax
from rich.console import Console

from zoo.dp.groups import style_summary
from zoo.dp.noise import resolve_noise_prng
from zoo.models.splash import resolve
from zoo.train import runlog
from zoo.train.engine import evaluate
from zoo.train.resume import ResumePoint, fingerprint
from zoo.train.run import Run, epsilon_at, privacy_at
from zoo.train.state import TrainState
from zoo.train.task import Task


def run_evaluation(run: Run, state: TrainState, frozen: dict) -> dict:
    """The run's eval metrics: the windows of ``eval_batches`` batches of the training batch's
    rows, :attr:`Run.eval_rows` at a time (a microbatch where the step has one)."""
    batches = run.task.eval_batches(run.eval_rows, run.eval_batch_count)
    return task_metrics(run.task, evaluate(run.engine, state, frozen, batches))


def task_metrics(task: Task, metrics: dict) -> dict:
    """The metrics that apply, as the task says (:meth:`Task.metrics`): accuracy for
    classifiers; for LMs bits per character of the eval text."""
    return task.metrics(metrics)


GROUP_PRIVACY = "a document or person spanning k units: about k x epsilon (docs/dp.md#what-is-guaranteed)"


def privacy_unit(task: Task, plan=None) -> dict:
    """What a DP run protects: one unit (a row, or one ``seq_len``-token window of an LM's
    train split), the number of them (``N``, public: the sampling rate publishes it), and
    where group privacy over several units is explained. Under ``dp.unit = "user"`` (the
    ``plan`` says): a user, the number of users, the most records a user gives a step, and
    the algorithm that draws them (``ULS`` or ``ELS``, zoo.dp.users and zoo.dp.els_sampler)."""
    if plan is not None and plan.unit == "user":
        return {
            "privacy_unit": "user",
            "privacy_units": plan.sampler.users,
            "records_per_user": plan.sampler.records_per_user,
            "user_sampling": plan.sampler.algorithm,
        }
    unit = f"window of {task.seq_len} tokens" if task.type.tokenized else "row"
    return {"privacy_unit": unit, "privacy_units": task.num_train, "group_privacy": GROUP_PRIVACY}


def last_logged_loss(out: Path) -> float:
    lines = (out / runlog.METRICS).read_text().splitlines() if (out / runlog.METRICS).exists() else []
    losses = [record["loss"] for record in map(json.loads, lines) if "loss" in record]
    return losses[-1] if losses else float("nan")


def say_resumed(console: Console, out: Path, point: ResumePoint, run: Run) -> None:
    changed = f" with {'; '.join(point.changes)}" if point.changes else ""
    console.print(f"resuming from step {point.step} in {out}{changed}", markup=False, highlight=False)
    if run.dp and run.steps > point.plan_steps:
        warnings.warn(
            f"extending a DP run past the {point.plan_steps} steps it was planned for: the noise "
            f"multiplier stays {run.dp.noise_multiplier:.4g}, and epsilon is accounted again over all "
            f"{run.steps} steps ({epsilon_at(run, run.steps):.4g} at delta={run.dp.delta:g}, "
            f"against {run.dp.epsilon:.4g} for the plan)",
            RuntimeWarning,
            stacklevel=3,
        )


def attention_ran(cfg, seq: int | None = None) -> dict:
    """``{"attention": kind, "platform": ...}``: the attention the model ran on this backend
    (``auto`` resolved: :func:`zoo.models.splash.resolve`), for the kinds that have one; ``{}``
    for the rest. Splash adds ``"splash"``: its block sizes (at ``seq`` tokens, as the kernels
    cut them) and its backward kernel (:meth:`zoo.models.splash.SplashBlocks.ran`)."""
    kind = getattr(cfg, "attention", None)
    if kind is None:
        return {}
    ran = {"attention": resolve(kind), "platform": jax.default_backend()}
    if ran["attention"] == "splash":
        ran["splash"] = cfg.splash_blocks.ran(seq)
    return ran


def remat_auto(chosen: dict) -> dict:
    """What ``--remat auto`` chose and why: the policy, the offload setting, the budget in
    bytes and where it came from (``flag``: ``--memory-budget``; ``device``: the device's
    memory less a margin, ``device_memory``, :mod:`zoo.train.auto_remat`), the reason, and
    every candidate's need, fit and time (``candidates``)."""
    keys = ("policy", "offload", "budget", "budget_source", "device_memory", "reason", "candidates")
    return {k: chosen[k] for k in keys if k in chosen}


def summarize(
    run: Run,
    out: Path,
    loss: float,
    eval_metrics: dict,
    compile_count: int,
    rate: float | None,
    point: ResumePoint | None,
    speed: dict | None = None,
) -> dict:
    """``summary.json``: what ran, where, how fast, and its final metrics (and privacy).
    ``speed``: the rates and seconds of :meth:`zoo.train.pace.Pace.summary`."""
    recipe, steps = run.recipe, run.steps
    summary = {
        "recipe": recipe.name,
        "backend": run.engine.backend,
        "remat": run.remat,
        **({"remat_auto": remat_auto(run.auto)} if run.auto else {}),
        "precision": run.precision.name,
        **attention_ran(run.engine.cfg, run.task.seq_len or getattr(run.engine.cfg, "max_len", None)),
        "placement": run.engine.placement.name,
        # The old spelling of the placement, one release more (and --remat auto's "offload").
        "offload": run.engine.placement.offload,
        "update_on": run.engine.placement.update_on,
        "model": recipe.model.preset,
        "dataset": recipe.data.dataset,
        "steps": steps,
        **({} if run.dp else {"train_loss": loss}),  # under DP the batches' loss is not released
        "examples_per_sec": rate,
        **(speed or {}),
        "compile_count": compile_count,
        "out_dir": str(out),
        "fingerprint": fingerprint(recipe),
        "trainable_params": run.freeze.trainable_count,
        "frozen_params": run.freeze.frozen_count,
        "mesh": run.engine.layout.spec.sizes,
        "devices": run.engine.layout.devices,
        **({"lora": run.lora.summary(run.freeze)} if run.lora else {}),
        **{k: v for k, v in eval_metrics.items() if k != "epsilon"},
    }
    if point:
        summary.update(resumed_from_step=point.step, changed_on_resume=list(point.changes))
    if run.dp:
        summary.update(
            **privacy_at(run, steps),
            **privacy_unit(run.task, run.dp),
            noise_multiplier=run.dp.noise_multiplier,
            sampling_prob=run.dp.sampler.sampling_prob,
            clip_norm=run.dp.clip_norm,
            clipping_style=style_summary(run.dp.clip_style, run.freeze, run.dp.clip_norm),
            accountant=run.dp.accounting.accountant,
            noise_prng=resolve_noise_prng(recipe.dp.noise_prng),  # "auto": the one that drew
            expected_batch_size=recipe.dp.expected_batch_size,
            padded_batch_size=run.dp.sampler.padded_batch_size,
            planned_steps=run.plan_steps,
        )
        pca = run.dp.mechanism.pca_noise_multiplier
        if pca is not None:  # data.dp_pca: its part of the budget
            summary.update(pca_noise_multiplier=pca, pca_epsilon=recipe.dp.pca_epsilon)
    return summary
