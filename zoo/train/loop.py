"""The training loop: the only place with clocks, files, progress bars and printing.

``build_run`` turns a recipe into a dataset, a model config, params and an engine.
``train`` runs it, writing ``metrics.jsonl``, ``recipe.json`` and orbax checkpoints, or
continues a run from its newest intact checkpoint (``zoo.train.resume`` says when it may).
"""

from __future__ import annotations

import io
import json
import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np
from rich.console import Console

from zoo import lora
from zoo.data.public import check_public_domain
from zoo.dp import PoissonSampler, epsilon_spent, ghost, resolve_noise_multiplier
from zoo.dp.accounting import guaranteed_privacy, truncation_budget
from zoo.errors import ZooError
from zoo.freeze import FreezePlan, resolve_freeze
from zoo.models import canonical
from zoo.models.registry import ModelConfig, get_config
from zoo.parallel import Layout, layout_for, spec_from_section
from zoo.parallel.distributed import is_main_process
from zoo.recipes import Recipe, to_dict
from zoo.remat import AUTO, get_policy
from zoo.scan import StackPlan
from zoo.train import auto_remat, checkpoint, runlog
from zoo.train.compiles import CompileCounter
from zoo.train.engine import DPRuntime, Engine, evaluate
from zoo.train.resume import (
    ResumePoint,
    check_same_data,
    data_digest,
    fingerprint,
    finished_summary,
    preflight,
)
from zoo.train.state import TrainState, make_optimizer, secret_train_key, train_key
from zoo.train.task import Task, fit_model_to_task, load_task, task_kind


class TrainingDiverged(ZooError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


@dataclass(frozen=True)
class DPPlan:
    sampler: PoissonSampler
    noise_multiplier: float
    epsilon: float  # what the planned steps spend
    steps: int  # the run stops here, inside the budget


@dataclass(frozen=True)
class Run:
    recipe: Recipe
    task: Task
    cfg: ModelConfig
    params: dict  # initial canonical params
    freeze: FreezePlan
    engine: Engine
    dp: DPPlan | None

    plan_steps: int  # the horizon of the lr schedule and the DP calibration (resume.py)
    lora: lora.LoraSetup | None = None
    base: dict | None = None  # a LoRA run's base checkpoint (checkpoint.base_reference)

    @property
    def steps(self) -> int:
        return self.dp.steps if self.dp else self.recipe.train.steps


def _dp_plan(recipe: Recipe, task: Task, plan_steps: int, layout: Layout) -> DPPlan | None:
    dp = recipe.dp
    if not dp.enabled:
        return None
    n = task.num_train
    sigma, eps = resolve_noise_multiplier(dp, n, plan_steps)
    # The padded batch splits over the mesh's batch axes (and into clipping microbatches).
    # Padding only adds masked rows: the sample, the clipped sum and the accounting stay.
    multiple = math.lcm(dp.microbatch_size or 1, layout.spec.batch_ways)
    # Sized so that truncating a draw adds at most delta / 1000 (docs/dp.md, "Fixed shapes").
    truncation = truncation_budget(delta=dp.delta, epsilon=eps, steps=plan_steps)
    sampler = PoissonSampler.for_expected_batch(
        n, dp.expected_batch_size, recipe.train.seed, truncation, pad_to_multiple=multiple, neighbours=True
    )
    return DPPlan(sampler=sampler, noise_multiplier=sigma, epsilon=eps, steps=recipe.train.steps)


def dp_train_key(recipe: Recipe) -> jax.Array:
    """Root of a DP run's step keys: secret unless ``dp.noise_seed`` pins it (see TrainState)."""
    seed = recipe.dp.noise_seed
    return secret_train_key() if seed is None else train_key(seed)


def _warn_if_public_noise_keys(state: TrainState, seed: int) -> None:
    # Checkpoints written before the step keys had a stream of their own stored key(seed),
    # whose step keys are the keys of the initial weights.
    if np.array_equal(np.asarray(state.rng), np.asarray(jax.random.key_data(jax.random.key(seed)))):
        warnings.warn(
            "this checkpoint's DP noise keys are the keys that drew its initial weights, so the "
            "noise can be recomputed from them; the privacy claim does not hold for this run. "
            "Start it again instead of resuming.",
            RuntimeWarning,
            stacklevel=3,
        )


def _warn_unused_microbatch(recipe: Recipe, cfg: ModelConfig) -> None:
    dp = recipe.dp
    if dp.enabled and dp.clipping == "ghost" and dp.microbatch_size and ghost.supports(cfg):
        warnings.warn(
            f"dp.microbatch_size={dp.microbatch_size} has no effect on memory with "
            f"dp.clipping='ghost' (there are no per-example gradients to chunk); it only rounds "
            f"the padded batch up to a multiple of {dp.microbatch_size}. Use dp.clipping='vmap' "
            f"to clip in microbatches.",
            stacklevel=3,
        )


def _warn_if_nothing_trains(freeze: FreezePlan, patterns: tuple[str, ...]) -> None:
    if freeze.trainable_count == 0:
        warnings.warn(
            f"--freeze {' '.join(repr(p) for p in patterns)} freezes every parameter: the run "
            "trains nothing and its weights stay as they are",
            stacklevel=3,
        )


def build_run(recipe: Recipe, plan_steps: int | None = None) -> Run:
    """Resolve a recipe: data, model sizes, initial params (fresh or ``init_from``), engine.

    ``plan_steps`` (default ``train.steps``) is the horizon of the learning-rate schedule and
    of the DP noise calibration; a resumed run that was extended keeps its original one.
    """
    plan_steps = plan_steps or recipe.train.steps
    seed = recipe.train.seed
    source = None
    lora.check_section(recipe.lora, recipe.freeze)
    mesh = spec_from_section(recipe.mesh)
    mesh.resolve(1 if mesh.is_single else jax.device_count())  # a bad mesh fails before the data loads
    if recipe.freeze.init_from:
        source = checkpoint.load_checkpoint(recipe.freeze.init_from)
    preset_cfg = get_config(recipe.model.preset, **dict(recipe.model.overrides))
    task = load_task(
        recipe.data,
        task_kind(preset_cfg),
        seed,
        tokenizer=source.tokenizer if source else None,
        max_len=getattr(preset_cfg, "max_len", None),
    )
    cfg = fit_model_to_task(recipe.model.preset, dict(recipe.model.overrides), task)
    cfg, params, freeze, adapters = _model_start(recipe, cfg, source)
    _warn_unused_microbatch(recipe, cfg)
    layout = layout_for(cfg, mesh)
    dp = _dp_plan(recipe, task, plan_steps, layout)
    if dp is None:
        layout.check_batch_rows(recipe.train.batch_size, "train.batch_size")
    optimizer = make_optimizer(recipe.optim, plan_steps, clip=dp is None)
    engine = Engine(
        cfg=cfg,
        backend=recipe.model.backend,
        # `auto` is chosen when training starts (zoo.train.auto_remat); until then, none
        remat=StackPlan(get_policy(_provisional(recipe.train.remat)), freeze.frozen_prefix),
        freeze=freeze,
        optimizer=optimizer,
        dp=DPRuntime(
            dp.noise_multiplier,
            recipe.dp.clip_norm,
            dp.sampler.expected_batch_size,
            recipe.dp.microbatch_size,
            recipe.dp.clipping,
            recipe.dp.noise_prng,
        )
        if dp
        else None,
        layout=layout,
    )
    base = (
        checkpoint.base_reference(source)
        if adapters is not None and source.model_config.lora is None
        else None
    )
    return Run(recipe, task, cfg, params, freeze, engine, dp, plan_steps, adapters, base)


def _provisional(remat: str) -> str:
    return "none" if remat == AUTO else remat


def _model_start(recipe: Recipe, cfg: ModelConfig, source):
    """``(config, initial params, freeze plan, LoRA setup or None)``: fresh params, a
    checkpoint's (``init_from``), or a checkpoint's with fresh adapters (``[lora]``)."""
    seed = recipe.train.seed
    adapters = lora.resolve(cfg, recipe.lora) if recipe.lora.enabled else None
    if adapters is not None:
        cfg = lora.adapted_config(cfg, adapters)
    try:
        if adapters is not None:
            params = lora.initial_params(cfg, source.model_config, source.params, seed)
        elif source is not None:
            canonical.check_params(cfg, source.params)
            params = source.params
        else:
            params = canonical.init_params(cfg, seed)
    except ZooError as error:
        if source is None:
            raise
        raise ZooError(
            f"--init-from {recipe.freeze.init_from!r} does not fit this recipe's model: {error}"
        ) from None
    if adapters is not None:
        freeze = lora.freeze_plan(cfg, adapters)
    else:
        freeze = resolve_freeze(params, recipe.freeze.patterns)
        _warn_if_nothing_trains(freeze, recipe.freeze.patterns)
    return cfg, params, freeze, adapters


def train_batch(run: Run, step: int) -> dict[str, np.ndarray]:
    if run.dp is None:
        return run.task.train_batch(step, run.recipe.train.batch_size, run.recipe.train.seed)
    indices, mask, _ = run.dp.sampler.batch_indices(step)
    return run.task.examples(indices, mask)


def _meta(run: Run) -> dict:
    tokenizer = run.task.data.tokenizer
    return {
        "recipe": to_dict(run.recipe),
        "fingerprint": fingerprint(run.recipe),
        "plan_steps": run.plan_steps,
        "data_digest": data_digest((run.task.data.x_train, run.task.data.y_train)),
        "model": checkpoint.model_meta(run.cfg, run.engine.backend),
        "tokenizer": tokenizer.to_json() if tokenizer else None,
        **({checkpoint.LORA_BASE: run.base} if run.base else {}),
    }


def _accounted(run: Run) -> dict:
    dp = run.recipe.dp
    return {"noise_multiplier": run.dp.noise_multiplier, "delta": dp.delta, "accountant": dp.accountant}


def _epsilon_at(run: Run, step: int) -> float:
    if step == 0:
        return 0.0
    return epsilon_spent(
        noise_multiplier=run.dp.noise_multiplier,
        delta=run.recipe.dp.delta,
        sampling_prob=run.dp.sampler.sampling_prob,
        steps=step,
        accountant=run.recipe.dp.accountant,
    )


def train(
    recipe: Recipe,
    out_dir: str | Path,
    *,
    resume: bool = False,
    console: Console | None = None,
    show_progress: bool = True,
    run: Run | None = None,
) -> dict:
    """Train ``recipe`` into ``out_dir`` and return the run summary.

    ``run`` may be passed when the caller already built it from the same recipe. With
    ``resume``, the run continues from the newest intact checkpoint if ``zoo.train.resume``
    allows it, and a finished run is left exactly as it was.
    """
    console = console or Console(stderr=True)
    main = is_main_process()
    if not main:  # on many processes, process 0 alone prints and writes run files
        console, show_progress = Console(file=io.StringIO()), False
    out = Path(out_dir)
    point = preflight(out, recipe, resume)
    if resume and point is None:
        console.print(f"no checkpoint in {out} yet; starting at step 0", markup=False, highlight=False)
    if (summary := finished_summary(out, point, recipe)) is not None:
        console.print(
            f"{out} already finished at step {point.step}; nothing to do", markup=False, highlight=False
        )
        return summary
    plan_steps = point.plan_steps if point else recipe.train.steps
    if run is None or run.plan_steps != plan_steps:
        run = build_run(recipe, plan_steps)
    if run.dp:  # nothing the model's shape depends on may come from the private data
        check_public_domain(recipe.data, run.task.data.task, checkpoint=recipe.freeze.init_from)
    if recipe.train.remat == AUTO:
        run = auto_remat.resolve(run, train_batch(run, 0), console)[0]
    out.mkdir(parents=True, exist_ok=True)
    engine, meta = run.engine, _meta(run)
    state, frozen = engine.init_state(run.params, recipe.train.seed, dp_train_key(recipe) if run.dp else None)
    start = 0
    if point:
        check_same_data(point.meta, meta, str(out))
        checkpoint.quarantine_after(out, point.step)
        state = checkpoint.restore_state(out, point.step, state)
        # Frozen weights come from the run's own checkpoint, not again from --init-from, whose
        # newest step may have moved on since.
        frozen = engine.place_frozen(run.freeze.split(checkpoint.restore_params(out, point.step))[1])
        start = point.step
        _say_resumed(console, out, point, run)
        if run.dp:
            _warn_if_public_noise_keys(state, recipe.train.seed)
    if main and (not point or point.changes):
        runlog.write_json(out / runlog.RECIPE, to_dict(recipe))
    log = runlog.MetricsLog(out / runlog.METRICS, start) if main else runlog.NullLog()
    batch_rows = run.dp.sampler.padded_batch_size if run.dp else recipe.train.batch_size
    steps, last_saved, done, eval_metrics = run.steps, start, start, {}
    timed_examples, timed_seconds, loss = 0, 0.0, float("nan")
    try:
        with CompileCounter() as compiles, runlog.progress_bar(console) as progress:
            bar = progress.add_task(
                recipe.name, total=steps, completed=start, loss="-", rate="-", visible=show_progress
            )
            for step in range(start, steps):
                batch = train_batch(run, step)
                tic = time.perf_counter()
                with compiles.track():
                    state, metrics = engine.train_step(state, frozen, engine.place_batch(batch))
                loss = float(metrics["loss"])
                if step > start:  # the first step includes compilation
                    timed_seconds += time.perf_counter() - tic
                    timed_examples += int(batch["mask"].sum())
                if not math.isfinite(loss):
                    raise TrainingDiverged(
                        f"loss became {loss} at step {step + 1}; stopped. The last good checkpoint "
                        f"is step {last_saved} in {str(out)!r}"
                        if last_saved
                        else f"loss became {loss} at step {step + 1}; stopped before any checkpoint"
                    )
                done = step + 1
                rate = timed_examples / timed_seconds if timed_seconds else 0.0
                progress.update(bar, completed=done, loss=f"{loss:.4f}", rate=f"{rate:,.0f}")
                if done % recipe.train.log_every == 0 or done == steps:
                    log.write(
                        {
                            "step": done,
                            "loss": loss,
                            "grad_norm": float(metrics["grad_norm"]),
                            "examples_per_sec": rate,
                        }
                    )
                if done % recipe.train.eval_every == 0 or done == steps:
                    eval_metrics = _evaluate(run, state, frozen, batch_rows)
                    if run.dp:
                        eval_metrics["epsilon"] = _epsilon_at(run, done)
                    log.write({"step": done, **eval_metrics})
                if done % recipe.train.checkpoint_every == 0 or done == steps:
                    params = run.freeze.merge(state.params, frozen)
                    checkpoint.save(out, done, state, lora.adapters_of(params) if run.base else params, meta)
                    last_saved = done
    except KeyboardInterrupt:
        saved = f"the last checkpoint is step {last_saved}" if last_saved else "no checkpoint was written yet"
        console.print(
            f"interrupted after step {done}; {saved} in {out}. "
            f"Continue with: zoo train {recipe.name} --resume --out {out}",
            markup=False,
            highlight=False,
        )
        raise
    finally:
        log.close()
    if start == steps:  # finished, but killed before its summary was written
        eval_metrics = _evaluate(run, state, frozen, batch_rows)
        loss = _last_logged_loss(out)
    summary = _summary(run, out, loss, eval_metrics, compiles.count, timed_examples, timed_seconds, point)
    if main:
        runlog.write_json(out / runlog.SUMMARY, summary)
    return summary


def _evaluate(run: Run, state: TrainState, frozen: dict, batch_rows: int) -> dict:
    metrics = evaluate(
        run.engine, state, frozen, run.task.eval_batches(batch_rows, run.recipe.train.eval_batches)
    )
    return task_metrics(run.task, metrics)


def task_metrics(task: Task, metrics: dict) -> dict:
    """Drop the metric that does not apply: accuracy for LMs, bits per char for classifiers."""
    drop = "eval_accuracy" if task.is_lm else "eval_bits_per_char"
    return {k: v for k, v in metrics.items() if k != drop}


def _last_logged_loss(out: Path) -> float:
    lines = (out / runlog.METRICS).read_text().splitlines() if (out / runlog.METRICS).exists() else []
    losses = [record["loss"] for record in map(json.loads, lines) if "loss" in record]
    return losses[-1] if losses else float("nan")


def _say_resumed(console: Console, out: Path, point: ResumePoint, run: Run) -> None:
    changed = f" with {'; '.join(point.changes)}" if point.changes else ""
    console.print(f"resuming from step {point.step} in {out}{changed}", markup=False, highlight=False)
    if run.dp and run.steps > point.plan_steps:
        warnings.warn(
            f"extending a DP run past the {point.plan_steps} steps it was planned for: the noise "
            f"multiplier stays {run.dp.noise_multiplier:.4g}, and epsilon is accounted again over all "
            f"{run.steps} steps ({_epsilon_at(run, run.steps):.4g} at delta={run.recipe.dp.delta:g}, "
            f"against {run.dp.epsilon:.4g} for the plan)",
            RuntimeWarning,
            stacklevel=3,
        )


def _summary(run, out, loss, eval_metrics, compile_count, timed_examples, timed_seconds, point) -> dict:
    recipe, steps = run.recipe, run.steps
    summary = {
        "recipe": recipe.name,
        "backend": run.engine.backend,
        "remat": f"{AUTO}:{run.engine.remat.policy.name}"
        if recipe.train.remat == AUTO
        else recipe.train.remat,
        "model": recipe.model.preset,
        "dataset": recipe.data.dataset,
        "steps": steps,
        "train_loss": loss,
        "examples_per_sec": timed_examples / timed_seconds if timed_seconds else None,
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
            **guaranteed_privacy(run.dp.sampler, **_accounted(run), steps=steps),
            noise_multiplier=run.dp.noise_multiplier,
            sampling_prob=run.dp.sampler.sampling_prob,
            clip_norm=recipe.dp.clip_norm,
            accountant=recipe.dp.accountant,
            expected_batch_size=recipe.dp.expected_batch_size,
            padded_batch_size=run.dp.sampler.padded_batch_size,
            planned_steps=run.plan_steps,
        )
    return summary
