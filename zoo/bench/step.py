"""The train step the remat benchmarks compile and time: ``zoo train``'s own, built by its stages.

A benchmark names a model (a preset, or a config), a remat policy, a precision policy and a
backend. They become recipe overrides, what ``zoo train --remat POLICY --precision P --set
model.backend=B`` changes (:func:`step_recipe`), and the run's stages make the step
(:mod:`zoo.train.stages`): the model start of a preset on synthetic batches
(:func:`~zoo.train.stages.config_start`) and the engine stage (:func:`~zoo.train.stages.engine`),
without DP. The step is the engine's ``train_step``: the recipe's optimizer (AdamW on its
warmup-cosine schedule over ``train.steps``, after the global-norm clip), the remat policy over
the scanned stack, the precision policy, the state donated. Nothing here writes a step by hand.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from zoo import lora, recipes
from zoo.api import example_batch, example_labels
from zoo.bench.common import state_stepper
from zoo.models import canonical
from zoo.models.registry import ModelConfig, get_config
from zoo.precision import FLOAT32
from zoo.recipes import Recipe
from zoo.train import stages
from zoo.train.engine import Engine
from zoo.train.remat_search import placed_shapes, program_digest


def step_recipe(
    backend: str = "nnx", remat: str = "none", precision: str | None = None, base: Recipe | None = None
) -> Recipe:
    """``base`` (default: every section's defaults) with the bench's backend, remat policy and
    precision (default float32) as overrides, checked as ``zoo train``'s flags are."""
    base = base or recipes.parse_recipe({}, "bench")
    changes = {
        "model": {"backend": backend},
        "train": {"remat": remat, "precision": precision or FLOAT32.name},
    }
    return recipes.override(base, changes)


def bench_start(cfg: ModelConfig, recipe: Recipe, params: dict | None = None, seed: int = 0) -> stages.Start:
    """``zoo train``'s model start for ``recipe`` on ``cfg`` (``params``, default fresh from
    ``seed``; shapes will do, and then only shapes are made): the recipe's LoRA adapters on a
    frozen base, or its freeze patterns."""
    if not recipe.lora.enabled:
        return stages.config_start(cfg, params, seed=seed, patterns=tuple(recipe.freeze.patterns))
    params = canonical.init_params(cfg, seed) if params is None else params
    adapters = lora.resolve(cfg, recipe.lora)
    adapted = lora.adapted_config(cfg, adapters)
    make = functools.partial(lora.initial_params, adapted, cfg, seed=seed)
    shapes = isinstance(jax.tree.leaves(params)[0], jax.ShapeDtypeStruct)
    with_adapters = jax.eval_shape(make, params) if shapes else make(params)
    return stages.config_start(adapted, with_adapters, freeze=lora.freeze_plan(adapted, adapters))


def engine_for(cfg: ModelConfig, recipe: Recipe, params: dict | None = None, seed: int = 0) -> Engine:
    """The engine ``zoo train`` builds for ``recipe`` on model ``cfg``: the stages' model start
    (:func:`bench_start`) and engine, no DP."""
    return stages.engine(recipe, bench_start(cfg, recipe, params, seed), None, recipe.train.steps)


@dataclass(frozen=True)
class CompiledStep:
    """A bench's compiled step and its arguments: ``(state, frozen, batch)``, arrays or shapes."""

    engine: Engine
    compiled: object
    lower_s: float
    compile_s: float
    program: str  # a digest of the lowered program: equal digests, equal steps
    state: object
    frozen: dict
    batch: dict

    def stepper(self, run: dict):
        """A stepper for :func:`zoo.bench.common.time_in_rounds` over ``run`` (``{"state":
        ...}``; ``run["out"]`` gets each step's metrics)."""
        return state_stepper(lambda state: self.compiled(state, self.frozen, self.batch), run)


def compile_step(
    cfg: ModelConfig,
    x,
    y,
    *,
    backend: str = "nnx",
    remat: str = "none",
    precision: str | None = None,
    seed: int = 0,
    params: dict | None = None,
    recipe: Recipe | None = None,
) -> CompiledStep:
    """``zoo train``'s step on ``cfg`` for the batch ``(x, y)`` under ``remat`` and ``precision``
    (on ``backend``; ``recipe``, default :func:`step_recipe`'s base, for the rest), lowered and
    compiled, each timed. Without ``params`` it is compiled from shapes alone (nothing is
    allocated); with them the arguments are real and the step can run."""
    recipe = step_recipe(backend, remat, precision, recipe)
    shapes_only = params is None
    if shapes_only:
        params = jax.eval_shape(functools.partial(canonical.init_params, cfg, seed))
    start = bench_start(cfg, recipe, params, seed)
    engine = stages.engine(recipe, start, None, recipe.train.steps)
    params = start.params  # with the recipe's adapters, if any
    batch = {"x": x, "y": y, "mask": jnp.ones((x.shape[0],), jnp.float32)}
    if shapes_only:
        state, frozen = placed_shapes(engine, *jax.eval_shape(lambda p: engine.init_state(p, seed), params))
        batch = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), batch)
    else:
        state, frozen = engine.init_state(params, seed)
        batch = engine.place_batch(batch)
    tic = time.perf_counter()
    lowered = engine.train_step.lower(state, frozen, batch)
    lowered_at = time.perf_counter()
    compiled = lowered.compile()
    lower_s, compile_s = lowered_at - tic, time.perf_counter() - lowered_at
    return CompiledStep(engine, compiled, lower_s, compile_s, program_digest(lowered), state, frozen, batch)


# --- the shared set-up of the train-step benches (zoo bench remat, its depth sweep) ------------

# Bench shapes per preset: big enough that activations dominate, small enough that the whole
# default remat bench (every policy) stays quick on a CPU.
DEFAULT_SHAPES = {"transformer-s": {"batch": 16, "seq": 128}}
FALLBACK_BATCH = 8

Progress = Callable[[str], None] | None


def say(progress: Progress, message: str) -> None:
    """Send ``message`` to ``progress`` (a progress line printer), if there is one."""
    if progress is not None:
        progress(message)


def bench_shape(model, cfg, batch: int | None, seq: int | None) -> tuple[int, int | None]:
    """(batch, seq) of a bench: the ones given, else the preset's :data:`DEFAULT_SHAPES`."""
    defaults = DEFAULT_SHAPES.get(model, {}) if isinstance(model, str) else {}
    batch = batch or defaults.get("batch", FALLBACK_BATCH)
    return batch, cfg.seq_or_default(seq or defaults.get("seq"))


def bench_config(model, num_layers: int | None, overrides: dict | None = None) -> ModelConfig:
    """The preset's config with the bench's overrides and, if given, its layer count."""
    # 0 is a count (an MLP of no hidden layer), not "unset"
    layers = {} if num_layers is None else {"num_layers": num_layers}
    return get_config(model, **(overrides or {}), **layers)


def warmed_inputs(model, cfg, backend: str, batch, seq, seed: int, progress, label: str):
    """The bench shape, an example batch and its labels, after a warm-up compile of one small
    step, so that one-time start-up costs (XLA and JAX caches) are not charged to whichever
    policy happens to compile first."""
    batch, seq = bench_shape(model, cfg, batch, seq)
    x = example_batch(cfg, batch, seed=seed, seq_len=seq)
    y = example_labels(cfg, x)
    say(progress, f"{label}: warm-up compile")
    compile_step(cfg, x[:1], y[:1], backend=backend, remat="full", seed=seed)
    return batch, seq, x, y
