"""The training loop: the only place with clocks, files, progress bars and printing.

``build_run`` turns a recipe into a dataset, a model config, params and an engine.
``train`` runs it, writing ``metrics.jsonl``, ``recipe.json`` and orbax checkpoints.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from zoo.configs import ModelConfig
from zoo.dp import PoissonSampler, epsilon_spent, ghost, resolve_noise_multiplier
from zoo.errors import ZooError
from zoo.models import canonical
from zoo.models.registry import get_config
from zoo.recipes import Recipe, to_dict
from zoo.remat import get_policy
from zoo.scan import StackPlan
from zoo.train import checkpoint
from zoo.train.compiles import CompileCounter
from zoo.train.engine import DPRuntime, Engine, evaluate
from zoo.train.freeze import FreezePlan, resolve_freeze
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

    @property
    def steps(self) -> int:
        return self.dp.steps if self.dp else self.recipe.train.steps


def _dp_plan(recipe: Recipe, task: Task) -> DPPlan | None:
    dp = recipe.dp
    if not dp.enabled:
        return None
    n = task.num_train
    sigma, eps = resolve_noise_multiplier(dp, n, recipe.train.steps)
    sampler = PoissonSampler.for_expected_batch(
        n, dp.expected_batch_size, recipe.train.seed, pad_to_multiple=dp.microbatch_size or 1
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


def build_run(recipe: Recipe) -> Run:
    """Resolve a recipe: data, model sizes, initial params (fresh or ``init_from``), engine."""
    seed = recipe.train.seed
    source = None
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
    if source is not None:
        try:
            canonical.check_params(cfg, source.params)
        except ZooError as error:
            raise ZooError(
                f"--init-from {recipe.freeze.init_from!r} does not fit this recipe's model: {error}"
            ) from None
        params = source.params
    else:
        params = canonical.init_params(cfg, seed)
    freeze = resolve_freeze(params, recipe.freeze.patterns)
    _warn_unused_microbatch(recipe, cfg)
    dp = _dp_plan(recipe, task)
    optimizer = make_optimizer(recipe.optim, recipe.train.steps, clip=dp is None)
    engine = Engine(
        cfg=cfg,
        backend=recipe.model.backend,
        remat=StackPlan(get_policy(recipe.train.remat), freeze.frozen_prefix),
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
    )
    return Run(recipe, task, cfg, params, freeze, engine, dp)


def train_batch(run: Run, step: int) -> dict[str, np.ndarray]:
    if run.dp is None:
        return run.task.train_batch(step, run.recipe.train.batch_size, run.recipe.train.seed)
    indices, mask, _ = run.dp.sampler.batch_indices(step)
    return run.task.examples(indices, mask)


def _meta(run: Run) -> dict:
    tokenizer = run.task.data.tokenizer
    return {
        "recipe": to_dict(run.recipe),
        "model": checkpoint.model_meta(run.cfg, run.engine.backend),
        "tokenizer": tokenizer.to_json() if tokenizer else None,
    }


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


class _Log:
    """metrics.jsonl writer: one JSON object per line, flushed as it goes."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("a")

    def write(self, record: dict) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TextColumn("{task.fields[rate]} ex/s"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
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

    ``run`` may be passed when the caller already built it from the same recipe.
    """
    console = console or Console(stderr=True)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    run = run or build_run(recipe)
    engine = run.engine
    state, frozen = engine.init_state(run.params, recipe.train.seed, dp_train_key(recipe) if run.dp else None)
    start = 0
    if resume and (saved := checkpoint.latest_step(out)) is not None:
        state = checkpoint.restore_state(out, saved, state)
        start = saved
        console.print(f"resuming from step {saved} in {out}")
        if run.dp:
            _warn_if_public_noise_keys(state, recipe.train.seed)
    elif not resume and checkpoint.latest_step(out) is not None:
        raise ZooError(
            f"{str(out)!r} already holds checkpoints; pass --resume to continue that "
            "run or choose another --out"
        )
    (out / "recipe.json").write_text(json.dumps(to_dict(recipe), indent=2) + "\n")
    meta, log = _meta(run), _Log(out / "metrics.jsonl")
    batch_rows = run.dp.sampler.padded_batch_size if run.dp else recipe.train.batch_size
    steps, last_saved, eval_metrics = run.steps, start, {}
    timed_examples, timed_seconds, loss = 0, 0.0, float("nan")
    try:
        with CompileCounter() as compiles, _progress(console) as progress:
            bar = progress.add_task(
                recipe.name, total=steps, completed=start, loss="-", rate="-", visible=show_progress
            )
            for step in range(start, steps):
                batch = train_batch(run, step)
                tic = time.perf_counter()
                with compiles.track():
                    state, metrics = engine.train_step(state, frozen, batch)
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
                    eval_metrics = evaluate(
                        engine, state, frozen, run.task.eval_batches(batch_rows, recipe.train.eval_batches)
                    )
                    if run.dp:
                        eval_metrics["epsilon"] = _epsilon_at(run, done)
                    log.write({"step": done, **eval_metrics})
                if done % recipe.train.checkpoint_every == 0 or done == steps:
                    params = run.freeze.merge(state.params, frozen)
                    checkpoint.save(out, done, state, params, meta)
                    last_saved = done
    finally:
        log.close()
    summary = {
        "recipe": recipe.name,
        "backend": engine.backend,
        "remat": recipe.train.remat,
        "model": recipe.model.preset,
        "dataset": recipe.data.dataset,
        "steps": steps,
        "train_loss": loss,
        "examples_per_sec": timed_examples / timed_seconds if timed_seconds else None,
        "compile_count": compiles.count,
        "out_dir": str(out),
        "trainable_params": run.freeze.trainable_count,
        "frozen_params": run.freeze.frozen_count,
        **{k: eval_metrics.get(k) for k in ("eval_loss", "eval_accuracy", "eval_bits_per_char")},
    }
    if run.task.is_lm:
        summary.pop("eval_accuracy")
    else:
        summary.pop("eval_bits_per_char")
    if run.dp:
        summary.update(
            epsilon=_epsilon_at(run, steps),
            delta=recipe.dp.delta,
            noise_multiplier=run.dp.noise_multiplier,
            sampling_prob=run.dp.sampler.sampling_prob,
            clip_norm=recipe.dp.clip_norm,
            accountant=recipe.dp.accountant,
            expected_batch_size=recipe.dp.expected_batch_size,
            padded_batch_size=run.dp.sampler.padded_batch_size,
        )
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
