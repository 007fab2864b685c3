"""A run, built once: a recipe becomes data, a model config, initial params, a freeze plan, an
engine (with its remat choice, ``auto``'s search included) and a DP plan.

Nothing after :func:`build_run` reads the recipe for a value the run holds.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass

import jax
import numpy as np
from rich.console import Console

from zoo import lora
from zoo.data.errors import DataDependentWarning
from zoo.data.public import check_public_domain
from zoo.dp import clipping_method
from zoo.dp.plan import DPPlan, make_plan
from zoo.errors import ZooError
from zoo.freeze import FreezePlan, resolve_freeze
from zoo.models import canonical
from zoo.models.registry import ModelConfig
from zoo.parallel import layout_for, spec_from_section
from zoo.precision import Precision
from zoo.recipes import Recipe
from zoo.remat import AUTO, get_policy
from zoo.scan import StackPlan
from zoo.train import auto_remat, checkpoint, checks, projection
from zoo.train.engine import Engine, make_engine
from zoo.train.state import batch_seed, make_optimizer, secret_train_key, train_key
from zoo.train.task import Task, fit_model_to_task, load_task


@dataclass(frozen=True)
class Run:
    recipe: Recipe
    task: Task
    cfg: ModelConfig
    params: dict  # initial canonical params
    freeze: FreezePlan
    engine: Engine
    plan_steps: int  # the horizon of the lr schedule and the DP calibration (resume.py)
    lora: lora.LoraSetup | None = None
    base: dict | None = None  # a LoRA run's base checkpoint (checkpoint.base_reference)
    remat: str = "none"  # what the summary reports: the policy, or "auto:<chosen>"

    @property
    def dp(self) -> DPPlan | None:
        """The DP settings of the run: the engine's, one object."""
        return self.engine.dp

    @property
    def precision(self) -> Precision:
        """The precision policy of the run: the engine's, one object."""
        return self.engine.precision

    @property
    def steps(self) -> int:
        return self.recipe.train.steps

    @property
    def batch_rows(self) -> int:
        """Rows of a training (and eval) batch: the padded Poisson batch under DP."""
        return self.dp.sampler.padded_batch_size if self.dp else self.recipe.train.batch_size


def epsilon_at(run: Run, step: int) -> float:
    """Epsilon the run has spent after ``step`` steps (at the run's delta)."""
    return run.dp.epsilon_at(step)


def privacy_at(run: Run, step: int) -> dict[str, float]:
    """The ``(epsilon, delta)`` the run guarantees after ``step`` steps, Poisson truncation
    included (:meth:`zoo.dp.plan.DPPlan.privacy_at`)."""
    return run.dp.privacy_at(step)


def with_batch_seed(run: Run, rng: jax.Array) -> Run:
    """Under DP, ``run`` drawing its Poisson batches from a seed of its own under the root key
    ``rng`` (``TrainState.rng``: secret unless ``dp.noise_seed`` pins it), so that which records
    a step reads is as secret as its noise; a resumed run draws the same batches. A run without
    DP is returned as it is (its batches follow ``train.seed``)."""
    if run.dp is None:
        return run
    sampler = dataclasses.replace(run.dp.sampler, seed=batch_seed(rng))
    engine = dataclasses.replace(run.engine, dp=dataclasses.replace(run.dp, sampler=sampler))
    return dataclasses.replace(run, engine=engine)


def dp_train_key(recipe: Recipe) -> jax.Array:
    """Root of a DP run's step keys: secret unless ``dp.noise_seed`` pins it (see TrainState)."""
    seed = recipe.dp.noise_seed
    return secret_train_key() if seed is None else train_key(seed)


def _warn_unused_microbatch(recipe: Recipe, cfg: ModelConfig) -> None:
    dp = recipe.dp
    if not (dp.enabled and dp.microbatch_size):
        return
    if not clipping_method(dp.clipping).uses_microbatch(cfg):
        warnings.warn(
            f"dp.microbatch_size={dp.microbatch_size} has no effect on memory with "
            f"dp.clipping={dp.clipping!r} (there are no per-example gradients to chunk); it only "
            f"rounds the padded batch up to a multiple of {dp.microbatch_size}. Use "
            f"dp.clipping='vmap' to clip in microbatches.",
            stacklevel=3,
        )


def _warn_if_nothing_trains(freeze: FreezePlan, patterns: tuple[str, ...]) -> None:
    if freeze.trainable_count == 0:
        warnings.warn(
            f"--freeze {' '.join(repr(p) for p in patterns)} freezes every parameter: the run "
            "trains nothing and its weights stay as they are",
            stacklevel=3,
        )


def build_run(
    recipe: Recipe,
    plan_steps: int | None = None,
    *,
    console: Console | None = None,
    choose_remat: bool = True,
) -> Run:
    """Resolve a recipe: data, model sizes, initial params (fresh or the start checkpoint's),
    freeze plan, engine and DP plan.

    ``plan_steps`` (default ``train.steps``) is the horizon of the learning-rate schedule and
    of the DP noise calibration; a resumed run that was extended keeps its original one.
    With ``train.remat = "auto"`` the policy is searched for here (its table printed on
    ``console``); ``choose_remat=False`` skips the search (no step runs: eval, params) and
    leaves the stack unrematerialized.
    """
    plan_steps = plan_steps or recipe.train.steps
    lora.check_section(recipe.lora, recipe.freeze, recipe.model.init_from)
    mesh = spec_from_section(recipe.mesh)
    mesh.resolve(1 if mesh.is_single else jax.device_count())  # a bad mesh fails before the data loads
    start = recipe.model.init_from
    source = checkpoint.load_checkpoint(start) if start else None
    preset_cfg = recipe.model_config
    if source is not None:
        checks.check_start(start, source.model_config, preset_cfg, recipe.lora.enabled)
        checks.check_vocabulary(start, source, recipe.data.vocabulary)
    if recipe.dp.enabled:  # the model's domain is declared, not read off the records
        check_public_domain(recipe.data, preset_cfg.task, checkpoint=start)
    with warnings.catch_warnings():
        if recipe.dp.enabled:  # a notice that depends on the records is a release too
            warnings.simplefilter("ignore", DataDependentWarning)
        task = load_task(
            recipe.data,
            task=preset_cfg.task,
            seed=recipe.train.seed,
            tokenizer=source.tokenizer if source else None,
            max_len=getattr(preset_cfg, "max_len", None),
            private=recipe.dp.enabled,
        )
    if source is not None and task.is_lm:
        checks.check_vocab_fits(start, source, task.data.vocab_size)
    cfg = fit_model_to_task(preset_cfg, task, recipe.model.preset, dict(recipe.model.overrides))
    cfg = projection.projected_config(cfg, recipe.data, source)
    cfg, params, freeze, adapters = _model_start(recipe, cfg, source)
    _warn_unused_microbatch(recipe, cfg)
    layout = layout_for(cfg, mesh)
    dp = (
        make_plan(recipe.dp, task.num_train, plan_steps, layout, seed=recipe.train.seed)
        if recipe.dp.enabled
        else None
    )
    if cfg.input_projection is not None and source is None:  # data.dp_pca: fitted once, here
        params = projection.fit(cfg, params, task.data.x_train, dp, dp_train_key(recipe) if dp else None)
    if dp is None:
        layout.check_batch_rows(recipe.train.batch_size, "train.batch_size")
        if not task.is_lm:
            checks.warn_batch_over_rows(recipe.train.batch_size, task.num_train, recipe.data.dataset)
    checks.warn_long_warmup(recipe.optim, plan_steps)
    policy = "none" if recipe.train.remat == AUTO else recipe.train.remat
    checks.warn_remat_without_stack(recipe.train.remat, cfg)
    engine = make_engine(
        cfg,
        recipe.model.backend,
        freeze,
        make_optimizer(recipe.optim, plan_steps, clip=dp is None),
        stack=StackPlan(get_policy(policy), freeze.frozen_prefix),
        dp=dp,
        layout=layout,
        precision=Precision(recipe.train.precision),
    )
    base = (
        checkpoint.base_reference(source)
        if adapters is not None and source.model_config.lora is None
        else None
    )
    run = Run(recipe, task, cfg, params, freeze, engine, plan_steps, adapters, base, policy)
    if recipe.train.remat == AUTO and choose_remat:
        chosen = auto_remat.resolve(run, train_batch(run, 0), console or Console(stderr=True))
        engine = auto_remat.with_policy(engine, chosen)
        run = dataclasses.replace(run, engine=engine, remat=f"{AUTO}:{chosen}")
    return run


def _model_start(recipe: Recipe, cfg: ModelConfig, source):
    """``(config, initial params, freeze plan, LoRA setup or None)``: fresh params, a
    checkpoint's (the start point), or a checkpoint's with fresh adapters (``[lora]``)."""
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
            f"--init-from {recipe.model.init_from!r} does not fit this recipe's model: {error}"
        ) from None
    if adapters is not None:
        freeze = lora.freeze_plan(cfg, adapters)
    else:
        freeze = resolve_freeze(params, (*recipe.freeze.patterns, *projection.fixed_patterns(cfg)))
        _warn_if_nothing_trains(freeze, recipe.freeze.patterns)
    return cfg, params, freeze, adapters


def train_batch(run: Run, step: int) -> dict[str, np.ndarray]:
    """The host batch of ``step``: a function of (seed, step) only, so resume replays it."""
    return local_batch(run, step, slice(None))[0]


def local_batch(run: Run, step: int, rows: slice) -> tuple[dict[str, np.ndarray], int]:
    """``rows`` of ``step`` 's batch (one process's share: only they are read), and how many
    real examples the whole batch holds."""
    if run.dp is None:
        batch_size = run.recipe.train.batch_size
        return run.task.train_batch(step, batch_size, run.recipe.train.seed, rows), batch_size
    indices, mask, realised = run.dp.sampler.batch_indices(step)
    return run.task.examples(indices[rows], mask[rows]), realised
