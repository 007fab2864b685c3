"""The stages of a run, in order: data, model start, DP plan, projection, engine.

Each stage is a function of the recipe and of the stages before it. :func:`zoo.train.run.build_run`
composes them; a variant (``zoo audit``, ``zoo bench``, ``benchmarks/``, resume) calls the same
stages and passes what it changes as arguments (the audit's canaries, a benchmark's own data,
a resumed run's root key), so what it measures is what ``zoo train`` runs.

The root key (:func:`root_key`) is made once per run. Under DP it is secret unless
``dp.noise_seed`` pins it, and everything secret hangs off it: the Poisson batches (the plan's
sampler seed, :func:`dp_plan`), the DP-PCA noise (:func:`projection`) and every step's noise.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import jax

from zoo import lora
from zoo.data.errors import DataDependentWarning
from zoo.data.public import check_public_domain
from zoo.dp.clipping import KEEP_SUM, ClippedSumTransform
from zoo.dp.plan import DPPlan, make_plan
from zoo.errors import ZooError
from zoo.freeze import FreezePlan, resolve_freeze
from zoo.models import canonical
from zoo.models.registry import ModelConfig
from zoo.parallel import layout_for, spec_from_section
from zoo.parallel.layout import Layout
from zoo.parallel.placement import Placement, placement_named
from zoo.precision import Precision
from zoo.recipes import Recipe
from zoo.remat import AUTO
from zoo.train import checkpoint, checks
from zoo.train import projection as fitted
from zoo.train.engine import Engine, GradientSettings, make_engine
from zoo.train.start import Start, config_start  # noqa: F401  (stage 2 without a recipe)
from zoo.train.state import batch_seed, make_optimizer, secret_train_key, train_key
from zoo.train.task import Task, fit_model_to_task, load_task


def dp_train_key(recipe: Recipe) -> jax.Array:
    """Root of a DP run's step keys: secret unless ``dp.noise_seed`` pins it (see TrainState)."""
    seed = recipe.dp.noise_seed
    return secret_train_key() if seed is None else train_key(seed)


def root_key(recipe: Recipe) -> jax.Array | None:
    """The run's root key data (``TrainState.rng``) under DP, made once: :func:`dp_train_key`'s.
    None without DP (the state's keys then follow ``train.seed``)."""
    return jax.random.key_data(dp_train_key(recipe)) if recipe.dp.enabled else None


def start_checkpoint(recipe: Recipe):
    """The checkpoint ``model.init_from`` names, checked against the recipe (None without one).
    The LoRA section and the mesh are checked first: a bad one fails before anything loads."""
    lora.check_section(recipe.lora, recipe.freeze, recipe.model.init_from)
    mesh = spec_from_section(recipe.mesh)
    if mesh.is_single and jax.process_count() > 1:  # one device would be process 0's alone
        raise ZooError(
            f"a run over {jax.process_count()} processes needs a mesh over their "
            f"{jax.device_count()} devices: pass --mesh auto (every device on data) or a spec "
            "such as --mesh data=2,fsdp=4 (sizes multiply to the device count)"
        )
    mesh.resolve(1 if mesh.is_single else jax.device_count())
    start = recipe.model.init_from
    if not start:
        return None
    source = checkpoint.load_checkpoint(start)
    checks.check_start(start, source.model_config, recipe.model_config, recipe.lora.enabled)
    checks.check_vocabulary(start, source, recipe.data.vocabulary)
    return source


def load_data(recipe: Recipe, source=None) -> Task:
    """Stage 1, the data: the ``[data]`` section loaded for the model's task. Under DP the
    model's domain is declared (checked here), the private loader reads nothing off the records
    that shapes the model, and notices that depend on the records are not shown."""
    preset_cfg = recipe.model_config
    start = recipe.model.init_from
    if recipe.dp.enabled:
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
    if source is not None and task.type.tokenized:
        checks.check_vocab_fits(start, source, task.data.vocab_size)
    return task


def model_start(recipe: Recipe, task: Task, source=None, *, seed: int | None = None) -> Start:
    """Stage 2 from the data: ``seed`` (default ``train.seed``) draws fresh params."""
    cfg = fit_model_to_task(recipe.model_config, task, recipe.model.preset, dict(recipe.model.overrides))
    cfg = fitted.projected_config(cfg, recipe.data, source)
    seed = recipe.train.seed if seed is None else seed
    adapters = lora.resolve(cfg, recipe.lora) if recipe.lora.enabled else None
    if adapters is not None:
        cfg = lora.adapted_config(cfg, adapters)
    params = _initial_params(cfg, source, adapters, seed, recipe.model.init_from)
    if adapters is not None:
        freeze = lora.freeze_plan(cfg, adapters)
    else:
        freeze = resolve_freeze(params, (*recipe.freeze.patterns, *fitted.fixed_patterns(cfg)))
        _warn_if_nothing_trains(freeze, recipe.freeze.patterns)
    base = None
    if adapters is not None and source.model_config.lora is None:
        base = checkpoint.base_reference(source)
    layout = layout_for(cfg, spec_from_section(recipe.mesh))
    return Start(cfg, params, freeze, layout, adapters, base, source)


def _initial_params(cfg: ModelConfig, source, adapters, seed: int, start: str | None) -> dict:
    """Fresh params, a checkpoint's (the start point), or a checkpoint's with fresh adapters."""
    try:
        if adapters is not None:
            return lora.initial_params(cfg, source.model_config, source.params, seed)
        if source is not None:
            canonical.check_params(cfg, source.params)
            return source.params
        return canonical.init_params(cfg, seed)
    except ZooError as error:
        if source is None:
            raise
        raise ZooError(f"--init-from {start!r} does not fit this recipe's model: {error}") from None


def dp_plan(
    recipe: Recipe,
    task: Task,
    start: Start,
    plan_steps: int,
    root: jax.Array | None,
    *,
    wrap: Callable | None = None,
    transform: ClippedSumTransform = KEEP_SUM,
) -> DPPlan | None:
    """Stage 3, the DP plan (None without DP): :func:`zoo.dp.plan.make_plan` over the task's
    records, its sampler seeded once, here, from the secret ``root`` key data, so which records
    a step reads is as secret as its noise and a resumed run (same root) draws the same batches.
    ``wrap`` changes the mechanism before it is made (``zoo audit``'s canaries,
    :class:`zoo.dp.mechanisms.Canaries`); ``transform`` changes the clipped sum before the noise
    (the white-box audit's, :class:`zoo.audit.canaries.WhiteBoxCanaries`): it travels with the plan."""
    if not recipe.dp.enabled:
        start.layout.check_batch_rows(recipe.train.batch_size, "train.batch_size")
        checks.require_batch_fits(recipe.train.batch_size, task.row_bytes, "train.batch_size")
        if not task.type.tokenized:
            checks.warn_batch_over_rows(recipe.train.batch_size, task.num_train, recipe.data.dataset)
        return None
    plan = make_plan(
        recipe.dp,
        task.num_train,
        plan_steps,
        start.layout,
        seed=batch_seed(root),
        microbatch_size=recipe.train.microbatch_size,
        wrap=wrap,
        users=task.user_groups(),
    )
    checks.require_batch_fits(plan.sampler.padded_batch_size, task.row_bytes, _batch_setting(recipe, plan))
    return plan.with_transform(transform)


def _batch_setting(recipe: Recipe, plan: DPPlan) -> str:
    """The setting that sized a DP run's padded batch: ``train.microbatch_size`` when one
    microbatch is the whole padded batch (the padding rounds up to it), else the expected batch."""
    microbatch, padded = recipe.train.microbatch_size, plan.sampler.padded_batch_size
    if microbatch is not None and microbatch * (plan.records_per_user or 1) >= padded:
        return "train.microbatch_size"
    return "dp.expected_batch_size" + (" with dp.records_per_user" if recipe.dp.unit == "user" else "")


def projection(start: Start, task: Task, plan: DPPlan | None, root: jax.Array | None) -> Start:
    """Stage 4, the input projection of ``data.dp_pca``: fitted once on the training features,
    with the plan's DP-PCA noise drawn under ``root`` (plain PCA without DP). A run that starts
    from a checkpoint keeps the checkpoint's. ``start`` unchanged without a projection."""
    if start.cfg.input_projection is None or start.source is not None:
        return start
    key = None if plan is None else jax.random.wrap_key_data(root)
    return start.with_params(fitted.fit(start.cfg, start.params, task.data.x_train, plan, key))


def engine(recipe: Recipe, start: Start, plan: DPPlan | None, plan_steps: int) -> Engine:
    """Stage 5, the engine, made from its parts (:func:`zoo.train.engine.make_engine`): the
    model start, the recipe's gradient settings (:func:`gradient_settings`), its placement
    (:func:`placement`) and the DP plan. A variant without a recipe (``zoo bench``) makes the
    same call with parts of its own."""
    checks.warn_long_warmup(recipe.optim, recipe.train.steps, plan_steps)
    checks.warn_remat_without_stack(recipe.train.remat, start.cfg)
    where = placement(recipe, start.layout)
    return make_engine(start, gradient_settings(recipe, plan_steps, private=plan is not None), where, plan)


def gradient_settings(recipe: Recipe, plan_steps: int, *, private: bool = False) -> GradientSettings:
    """The recipe's gradient settings: the backend, the optimizer over ``plan_steps`` (no global
    clip under DP: the gradients are clipped per example), the remat policy (``auto`` starts
    unrematerialized: :mod:`zoo.train.auto_remat` picks later), the precision and
    ``train.microbatch_size``."""
    return GradientSettings(
        recipe.model.backend,
        make_optimizer(recipe.optim, plan_steps, clip=not private),
        remat="none" if recipe.train.remat == AUTO else recipe.train.remat,
        precision=Precision(recipe.train.precision),
        microbatch_size=recipe.train.microbatch_size,
    )


def placement(recipe: Recipe, layout: Layout) -> Placement:
    """``train.placement``, checked against the run's resolved ``layout`` (a mesh that
    ``--mesh data=auto`` resolved to several devices, say), one line naming the setting."""
    where = placement_named(recipe.train.placement)
    try:
        where.check(layout=layout)
    except ValueError as error:
        raise ZooError(f"train.{error}") from None
    return where


def _warn_if_nothing_trains(freeze: FreezePlan, patterns: tuple[str, ...]) -> None:
    if freeze.trainable_count == 0:
        warnings.warn(
            f"--freeze {' '.join(repr(p) for p in patterns)} freezes every parameter: the run "
            "trains nothing and its weights stay as they are",
            stacklevel=3,
        )
